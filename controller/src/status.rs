//! The Ingress status writer: `status.loadBalancer.ingress` of every served Ingress lists the
//! addresses clients reach duet at, from `--publish-service NS/NAME` (every address of that
//! Service, both families, hostnames too) or `--publish-status-address A,B`.
//!
//! Written only by the leader, only once the Ingress's routes are live (the control loop reports
//! the Ingresses of each applied snapshot), only when the value differs from what the API holds,
//! as a JSON merge patch of the `status` subresource. An Ingress that stops being ours gets its
//! status cleared. A publish Service with a single IP family (one `spec.ipFamilies` entry) by its
//! own `SingleStack` policy (or none) is logged as a warning and shown on `/debug/routes`; one with
//! a dual-stack policy that got one family is on a single-stack cluster, and gets no warning.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::{Ingress, IngressLoadBalancerIngress};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{reflector, watcher, WatchStreamExt as _};
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::object::NsName;
use crate::source::kube::{trim, Stores};
use crate::stored::StoredIngress;

/// Where the published addresses come from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Publish {
    /// No status is written.
    #[default]
    Nothing,
    /// Every address of this Service (`--publish-service NS/NAME`).
    Service(NsName),
    /// These IPs or host names (`--publish-status-address A,B`).
    Addresses(Vec<String>),
}

/// One entry of `status.loadBalancer.ingress` per IP or host name, in the order given, without
/// duplicates.
pub fn entries<'a>(
    addresses: impl IntoIterator<Item = &'a str>,
) -> Vec<IngressLoadBalancerIngress> {
    let mut out: Vec<IngressLoadBalancerIngress> = Vec::new();
    for a in addresses
        .into_iter()
        .map(str::trim)
        .filter(|a| !a.is_empty())
    {
        let entry = match a.parse::<IpAddr>() {
            Ok(ip) => IngressLoadBalancerIngress {
                ip: Some(ip.to_string()),
                ..Default::default()
            },
            Err(_) => IngressLoadBalancerIngress {
                hostname: Some(a.to_owned()),
                ..Default::default()
            },
        };
        if !out.contains(&entry) {
            out.push(entry);
        }
    }
    out
}

/// The addresses of a publish Service: for `type: LoadBalancer` every entry of its
/// `status.loadBalancer.ingress` (IPs of both families and host names), otherwise every
/// `spec.clusterIPs` entry (`spec.clusterIP` when the list is missing), for `ExternalName` the
/// external name. Also a warning when the Service has a single IP family by its own
/// `SingleStack` policy (not when a dual-stack policy got one family: a single-stack cluster).
pub fn service_addresses(service: &Service) -> (Vec<IngressLoadBalancerIngress>, Option<String>) {
    let spec = service.spec.clone().unwrap_or_default();
    let name = format!(
        "{}/{}",
        service.metadata.namespace.as_deref().unwrap_or("default"),
        service.metadata.name.as_deref().unwrap_or_default()
    );
    let mut addresses: Vec<String> = Vec::new();
    match spec.type_.as_deref() {
        Some("LoadBalancer") => {
            let lb = service
                .status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|l| l.ingress.as_ref());
            for entry in lb.into_iter().flatten() {
                addresses.extend(entry.ip.clone());
                addresses.extend(entry.hostname.clone());
            }
        }
        Some("ExternalName") => addresses.extend(spec.external_name.clone()),
        _ => {
            let ips = spec
                .cluster_ips
                .clone()
                .or_else(|| spec.cluster_ip.clone().map(|ip| vec![ip]))
                .unwrap_or_default();
            addresses.extend(ips.into_iter().filter(|ip| ip != "None"));
        }
    }
    let families = spec.ip_families.unwrap_or_default();
    // A dual-stack policy that got one family means a single-stack cluster: nothing to fix.
    let single_stack_policy = !matches!(
        spec.ip_family_policy.as_deref(),
        Some("PreferDualStack" | "RequireDualStack")
    );
    let warning = (families.len() == 1 && single_stack_policy).then(|| {
        format!(
            "publish Service {name} has a single IP family ({}, ipFamilyPolicy SingleStack): Ingress status lists no {} address; set ipFamilyPolicy: PreferDualStack",
            families[0],
            if families[0] == "IPv6" { "IPv4" } else { "IPv6" }
        )
    });
    (entries(addresses.iter().map(String::as_str)), warning)
}

/// What `/debug/routes` shows about status.
#[derive(Clone, Debug, Default, Serialize)]
pub struct StatusView {
    /// Where addresses come from (`service ns/name`, `addresses`, or nothing).
    pub publish: String,
    /// The addresses written to served Ingresses (`None` until the publish Service was read).
    pub addresses: Option<Vec<String>>,
    /// Whether this replica leads (and so writes status).
    pub leading: bool,
    /// A problem with the publish Service, e.g. a single IP family.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

/// The status writer's shared view, for `/debug/routes`.
#[derive(Clone, Debug, Default)]
pub struct StatusDebug(Arc<Mutex<StatusView>>);

impl StatusDebug {
    /// The current view as JSON.
    pub fn json(&self) -> Value {
        let view = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        serde_json::to_value(view).unwrap_or(Value::Null)
    }

    fn update(&self, f: impl FnOnce(&mut StatusView)) {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()));
    }
}

fn shown(entries: &[IngressLoadBalancerIngress]) -> Vec<String> {
    entries
        .iter()
        .filter_map(|e| e.ip.clone().or_else(|| e.hostname.clone()))
        .collect()
}

/// What the writer needs.
pub struct StatusInputs {
    /// The client.
    pub client: kube::Client,
    /// Where addresses come from.
    pub publish: Publish,
    /// The Ingress stores of the watchers.
    pub stores: Stores,
    /// Our Ingresses whose routes are live (from the control loop).
    pub live: watch::Receiver<Arc<BTreeSet<NsName>>>,
    /// Whether this replica leads.
    pub leading: watch::Receiver<bool>,
}

impl std::fmt::Debug for StatusInputs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusInputs")
            .field("publish", &self.publish)
            .finish_non_exhaustive()
    }
}

/// Starts the writer; returns the `/debug/routes` view.
pub fn spawn(inputs: StatusInputs) -> StatusDebug {
    let debug = StatusDebug::default();
    let (addresses_tx, addresses) = watch::channel::<Option<Vec<IngressLoadBalancerIngress>>>(None);
    match &inputs.publish {
        Publish::Nothing => {}
        Publish::Addresses(list) => {
            let list = entries(list.iter().map(String::as_str));
            debug.update(|v| v.addresses = Some(shown(&list)));
            addresses_tx.send_replace(Some(list));
        }
        Publish::Service(name) => {
            let api = Api::<Service>::namespaced(inputs.client.clone(), &name.namespace);
            tokio::spawn(watch_publish_service(
                api,
                name.clone(),
                addresses_tx,
                debug.clone(),
            ));
        }
    }
    debug.update(|v| {
        v.publish = match &inputs.publish {
            Publish::Nothing => "nothing".to_owned(),
            Publish::Service(name) => format!("service {name}"),
            Publish::Addresses(_) => "addresses".to_owned(),
        };
    });
    if inputs.publish != Publish::Nothing {
        tokio::spawn(write_loop(inputs, addresses, debug.clone()));
    }
    debug
}

async fn watch_publish_service(
    api: Api<Service>,
    name: NsName,
    tx: watch::Sender<Option<Vec<IngressLoadBalancerIngress>>>,
    debug: StatusDebug,
) {
    let (reader, writer) = reflector::store();
    let config = watcher::Config::default().fields(&format!("metadata.name={}", name.name));
    let mut stream = std::pin::pin!(watcher(api, config)
        .backoff(crate::source::kube::WatchBackoff::default())
        .modify(trim::<Service>)
        .reflect(writer));
    let mut last_warning = None;
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => continue,
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(service = %name, %error, "Publish Service watch failed; retrying");
                continue;
            }
        }
        let (addresses, warning) = match reader.state().first() {
            Some(service) => service_addresses(service),
            None => (
                Vec::new(),
                Some(format!("publish Service {name} does not exist")),
            ),
        };
        if warning != last_warning {
            if let Some(w) = &warning {
                tracing::warn!(service = %name, warning = %w, "Publish Service problem");
            }
            last_warning = warning.clone();
        }
        debug.update(|v| {
            v.addresses = Some(shown(&addresses));
            v.warning = warning;
        });
        tx.send_if_modified(|old| {
            let new = Some(addresses);
            if *old != new {
                *old = new;
                true
            } else {
                false
            }
        });
    }
}

fn current(ingress: &StoredIngress) -> Vec<IngressLoadBalancerIngress> {
    ingress
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.clone())
        .unwrap_or_default()
}

/// What the writer decides for one Ingress: the value it should have, or `None` to leave it.
pub fn desired(
    ingress: &StoredIngress,
    live: bool,
    was_live: bool,
    addresses: &[IngressLoadBalancerIngress],
) -> Option<Vec<IngressLoadBalancerIngress>> {
    let now = current(ingress);
    let want = if live {
        addresses.to_vec()
    } else if was_live || (!addresses.is_empty() && now == addresses) {
        // No longer ours: clear what we wrote, and only that.
        Vec::new()
    } else {
        return None;
    };
    (now != want).then_some(want)
}

/// Writes `status.loadBalancer.ingress` of one Ingress (cleared when `want` is empty).
async fn patch_status(
    client: &kube::Client,
    key: &NsName,
    want: &[IngressLoadBalancerIngress],
) -> Result<Ingress, kube::Error> {
    let api = Api::<Ingress>::namespaced(client.clone(), &key.namespace);
    let value = if want.is_empty() {
        Value::Null
    } else {
        serde_json::to_value(want).unwrap_or(Value::Null)
    };
    let patch = json!({ "status": { "loadBalancer": { "ingress": value } } });
    api.patch_status(&key.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
}

async fn write_loop(
    inputs: StatusInputs,
    mut addresses: watch::Receiver<Option<Vec<IngressLoadBalancerIngress>>>,
    debug: StatusDebug,
) {
    let StatusInputs {
        client,
        stores,
        mut live,
        mut leading,
        ..
    } = inputs;
    let mut changes = stores.ingress_changes.clone();
    let mut was_live: BTreeSet<NsName> = BTreeSet::new();
    // Writes whose effect the Ingress store has not shown yet: the value and the
    // resourceVersion the object had before the write.
    let mut written: BTreeMap<NsName, (Vec<IngressLoadBalancerIngress>, Option<String>)> =
        BTreeMap::new();
    let (mut addresses_open, mut changes_open) = (true, true);
    loop {
        let live_now = live.borrow_and_update().clone();
        was_live.extend(live_now.iter().cloned());
        let leads = *leading.borrow_and_update();
        debug.update(|v| v.leading = leads);
        let wanted = addresses.borrow_and_update().clone();
        changes.borrow_and_update();
        let mut retry = false;
        if let (true, Some(wanted)) = (leads, wanted) {
            for ingress in stores.ingresses() {
                let key = NsName::new(
                    ingress.metadata.namespace.clone().unwrap_or_default(),
                    ingress.metadata.name.clone().unwrap_or_default(),
                );
                let is_live = live_now.contains(&key);
                let Some(want) = desired(&ingress, is_live, was_live.contains(&key), &wanted)
                else {
                    written.remove(&key);
                    if !is_live && current(&ingress).is_empty() {
                        was_live.remove(&key);
                    }
                    continue;
                };
                let version = ingress.metadata.resource_version.clone();
                if written.get(&key) == Some(&(want.clone(), version.clone())) {
                    continue; // our write is on its way back through the watch
                }
                match patch_status(&client, &key, &want).await {
                    Ok(_) => {
                        tracing::info!(ingress = %key, addresses = ?shown(&want), "Ingress status updated");
                        written.insert(key, (want, version));
                    }
                    Err(error) => {
                        tracing::warn!(ingress = %key, %error, "Ingress status update failed; retrying");
                        retry = true;
                    }
                }
            }
        }
        // A closed channel is ready at once, every time: stop selecting on it, or this loop
        // spins. The fixed addresses of `--publish-status-address` are sent once and their
        // sender dropped; the publish-Service and Ingress senders live as long as their watches.
        tokio::select! {
            r = live.changed() => if r.is_err() { return },
            r = leading.changed() => if r.is_err() { return },
            r = addresses.changed(), if addresses_open => addresses_open = r.is_ok(),
            r = changes.changed(), if changes_open => changes_open = r.is_ok(),
            () = tokio::time::sleep(Duration::from_secs(2)), if retry => {}
        }
        // Coalesce a burst of Ingress events into one pass over the store.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        LoadBalancerIngress, LoadBalancerStatus, ServiceSpec, ServiceStatus,
    };
    use k8s_openapi::api::networking::v1::{IngressLoadBalancerStatus, IngressStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn ips(list: &[IngressLoadBalancerIngress]) -> Vec<String> {
        shown(list)
    }

    fn svc(spec: ServiceSpec, status: Option<ServiceStatus>) -> Service {
        Service {
            metadata: ObjectMeta {
                namespace: Some("duet".to_owned()),
                name: Some("edge".to_owned()),
                ..Default::default()
            },
            spec: Some(spec),
            status,
        }
    }

    #[test]
    fn cluster_ip_service_publishes_every_cluster_ip() {
        let s = svc(
            ServiceSpec {
                cluster_ip: Some("10.96.0.10".to_owned()),
                cluster_ips: Some(vec!["10.96.0.10".to_owned(), "fd00::10".to_owned()]),
                ip_families: Some(vec!["IPv4".to_owned(), "IPv6".to_owned()]),
                ..Default::default()
            },
            None,
        );
        let (addresses, warning) = service_addresses(&s);
        assert_eq!(ips(&addresses), ["10.96.0.10", "fd00::10"]);
        assert_eq!(warning, None);
    }

    #[test]
    fn load_balancer_service_publishes_every_ingress_entry_with_hostnames() {
        let entry = |ip: Option<&str>, host: Option<&str>| LoadBalancerIngress {
            ip: ip.map(str::to_owned),
            hostname: host.map(str::to_owned),
            ..Default::default()
        };
        let s = svc(
            ServiceSpec {
                type_: Some("LoadBalancer".to_owned()),
                cluster_ips: Some(vec!["10.96.0.10".to_owned()]),
                ip_families: Some(vec!["IPv6".to_owned()]),
                ..Default::default()
            },
            Some(ServiceStatus {
                load_balancer: Some(LoadBalancerStatus {
                    ingress: Some(vec![
                        entry(Some("192.0.2.10"), None),
                        entry(Some("2001:db8::10"), None),
                        entry(None, Some("lb.example.com")),
                    ]),
                }),
                ..Default::default()
            }),
        );
        let (addresses, warning) = service_addresses(&s);
        assert_eq!(
            ips(&addresses),
            ["192.0.2.10", "2001:db8::10", "lb.example.com"]
        );
        assert_eq!(addresses[2].hostname.as_deref(), Some("lb.example.com"));
        let warning = warning.expect("single family warns");
        assert!(
            warning.contains("duet/edge") && warning.contains("no IPv4"),
            "{warning}"
        );
    }

    #[test]
    fn configured_addresses_are_ips_or_hostnames_without_duplicates() {
        let list = entries([
            "192.0.2.1",
            " 2001:db8::1",
            "lb.example.com",
            "192.0.2.1",
            "",
        ]);
        assert_eq!(ips(&list), ["192.0.2.1", "2001:db8::1", "lb.example.com"]);
        assert_eq!(list[1].ip.as_deref(), Some("2001:db8::1"));
        assert_eq!(list[2].hostname.as_deref(), Some("lb.example.com"));
    }

    fn ingress_with(status: &[IngressLoadBalancerIngress]) -> StoredIngress {
        StoredIngress {
            status: (!status.is_empty()).then(|| IngressStatus {
                load_balancer: Some(IngressLoadBalancerStatus {
                    ingress: Some(status.to_vec()),
                }),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn writes_only_live_ingresses_only_on_change_and_clears_what_it_wrote() {
        let ours = entries(["192.0.2.1", "2001:db8::1"]);
        let other = entries(["198.51.100.7"]);
        // Live, empty status: write.
        assert_eq!(
            desired(&ingress_with(&[]), true, false, &ours),
            Some(ours.clone())
        );
        // Live, already right: nothing.
        assert_eq!(desired(&ingress_with(&ours), true, true, &ours), None);
        // Not live (not ours, or routes not applied yet) and never was: leave it alone.
        assert_eq!(desired(&ingress_with(&other), false, false, &ours), None);
        assert_eq!(desired(&ingress_with(&[]), false, false, &ours), None);
        // No longer ours: cleared.
        assert_eq!(
            desired(&ingress_with(&ours), false, true, &ours),
            Some(Vec::new())
        );
        // Ours by an earlier leader (same addresses), now not ours: cleared too.
        assert_eq!(
            desired(&ingress_with(&ours), false, false, &ours),
            Some(Vec::new())
        );
        // Addresses changed: rewritten.
        assert_eq!(
            desired(&ingress_with(&other), true, true, &ours),
            Some(ours.clone())
        );
    }
}
