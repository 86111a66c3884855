//! The stand-in load-balancer controller: the cluster's answer to `type: LoadBalancer` Services
//! (there is no cloud). Every LoadBalancer Service gets one address from [`POOL_V4`] and one from
//! [`POOL_V6`] for each family in its `spec.ipFamilies`, kept for the Service's life (by uid),
//! written to `status.loadBalancer.ingress` in the Service's family order (`ipMode: VIP`), and
//! added to the namespace's loopback interface.
//!
//! Traffic: `LB_IP:port` (TCP, and UDP for UDP ports) is DNATed by nftables to the ready endpoints of the Service's
//! EndpointSlices of that family, at the slice port named like the Service port (the port
//! kube-proxy would use), chosen at random per connection (`numgen random`). The rules are one
//! `ip duet_lb` and one `ip6 duet_lb` table, each with a `prerouting` and an `output` nat chain
//! (so connections from inside the namespace, where the tests and pods run, are forwarded too),
//! replaced whole in one `nft -f` transaction whenever they change. The client's address is kept
//! (DNAT, no SNAT), as a load balancer with `externalTrafficPolicy: Local` keeps it. The cluster
//! IPs of those Services are forwarded the same way (the Service ranges get a `local` route), as
//! kube-proxy would: a Gateway whose status still shows them (the load balancer not having
//! answered yet) is reachable there too.
//!
//! A Service asking for addresses with the `metallb.io/loadBalancerIPs` annotation gets exactly
//! those when they are in the pools, one per family of the Service and free, and none otherwise
//! (as MetalLB does).
//!
//! A Service whose `status.loadBalancer.ingress` someone else wrote (a test standing in for a
//! load balancer of its own) is left to them: its addresses are released and it is skipped from
//! then on. Status writes carry the `resourceVersion` read, so a write racing theirs loses.
//!
//! Without the `nft` binary (Debian package `nftables`) addresses and status are still assigned,
//! and the failure to program rules is logged on every pass.
//!
//! It runs on a thread of its own inside the cluster's network namespace, polling the
//! LoadBalancer Services and, while there are any, the EndpointSlices every 200 ms, as the
//! stand-in kubelet does.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use http::Method;
use serde_json::{json, Value};
use tokio::sync::oneshot;

use super::netns::{enter_path, ip, local_address};
use super::{POD_INTERFACE, SERVICE_CIDR_V4, SERVICE_CIDR_V6};
use crate::runner::kube_api::KubeApi;

/// The IPv4 load-balancer pool (`10.250.0.1` to `10.250.0.254`).
pub const POOL_V4: &str = "10.250.0.0/24";
/// The IPv6 load-balancer pool (`fd00:10:250::1` to `fd00:10:250::fffe`).
pub const POOL_V6: &str = "fd00:10:250::/112";

const POOL_V4_BASE: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 0);
const POOL_V6_BASE: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x250, 0, 0, 0, 0, 0);
const POOL_V4_SIZE: u32 = 254;
const POOL_V6_SIZE: u32 = 0xfffe;

/// The annotation a Service asks for given addresses with (MetalLB's: comma-separated, one per
/// family), as duet's Gateway Services do for `spec.addresses`.
pub const REQUESTED_IPS: &str = "metallb.io/loadBalancerIPs";

fn in_pool_v4(ip: Ipv4Addr) -> bool {
    let offset = u32::from(ip).wrapping_sub(u32::from(POOL_V4_BASE));
    (1..=POOL_V4_SIZE).contains(&offset)
}

fn in_pool_v6(ip: Ipv6Addr) -> bool {
    let offset = u128::from(ip).wrapping_sub(u128::from(POOL_V6_BASE));
    (1..=u128::from(POOL_V6_SIZE)).contains(&offset)
}

/// How often Services and EndpointSlices are read.
const TICK: Duration = Duration::from_millis(200);

/// The nftables program.
const NFT: &str = "nft";

/// The running controller; dropping it stops it.
#[derive(Debug)]
pub struct LoadBalancer {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for LoadBalancer {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl LoadBalancer {
    /// Starts the controller thread in the namespace at `netns`, talking to the API server of
    /// `kubeconfig`.
    pub fn start(netns: &Path, kubeconfig: &Path) -> anyhow::Result<LoadBalancer> {
        let (stop, stopped) = oneshot::channel();
        let (netns, kubeconfig) = (netns.to_owned(), kubeconfig.to_owned());
        let thread = std::thread::Builder::new()
            .name("duet-loadbalancer".into())
            .spawn(move || run_thread(&netns, &kubeconfig, stopped))
            .context("cannot start the load-balancer thread")?;
        Ok(LoadBalancer {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

/// Whether the `nft` program can be run (the load balancer forwards traffic only with it).
pub fn nft_available() -> bool {
    Command::new(NFT)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn run_thread(netns: &Path, kubeconfig: &Path, mut stopped: oneshot::Receiver<()>) {
    let run = async {
        enter_path(netns)?;
        route_service_ranges()?;
        let api = KubeApi::from_kubeconfig(kubeconfig).await?;
        let mut state = State::new(api);
        loop {
            if let Err(e) = state.pass().await {
                tracing::warn!(error = %format!("{e:#}"), "The load balancer failed a pass");
            }
            tokio::select! {
                _ = &mut stopped => break,
                () = tokio::time::sleep(TICK) => {}
            }
        }
        anyhow::Ok(())
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return tracing::error!(error = %e, "The load balancer cannot start a runtime"),
    };
    if let Err(e) = runtime.block_on(run) {
        tracing::error!(error = %format!("{e:#}"), "The load balancer stopped");
    }
}

/// The addresses given to one Service.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Assigned {
    v4: Option<Ipv4Addr>,
    v6: Option<Ipv6Addr>,
}

#[derive(Debug)]
struct State {
    api: KubeApi,
    /// By Service uid.
    assigned: HashMap<String, Assigned>,
    /// Services whose status someone else writes, by uid.
    foreign: HashSet<String>,
    /// The ruleset last applied.
    ruleset: String,
}

/// A Service port to forward: its name, number and protocol.
#[derive(Debug)]
struct ServicePort {
    name: String,
    port: u16,
    /// `tcp` or `udp` (nft's words).
    protocol: &'static str,
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn is_load_balancer(service: &Value) -> bool {
    str_at(service, "/spec/type") == "LoadBalancer"
}

/// The Service's families in its order (`IPv4`, `IPv6`).
fn families(service: &Value) -> Vec<String> {
    service["spec"]["ipFamilies"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect()
}

/// Its TCP and UDP ports; a port without a valid number is skipped.
fn forwarded_ports(service: &Value) -> Vec<ServicePort> {
    service["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| {
            let protocol = match p["protocol"].as_str().unwrap_or("TCP") {
                "TCP" => "tcp",
                "UDP" => "udp",
                _ => return None,
            };
            let port = u16::try_from(p["port"].as_u64()?).ok()?;
            Some(ServicePort {
                name: p["name"].as_str().unwrap_or_default().to_owned(),
                port,
                protocol,
            })
        })
        .collect()
}

/// The ready endpoints (`address`, `port`) of `slices` of one family for the Service port
/// named `name`.
fn endpoints(slices: &[&Value], address_type: &str, name: &str) -> Vec<(IpAddr, u16)> {
    let mut out = Vec::new();
    for slice in slices.iter().filter(|s| s["addressType"] == address_type) {
        let port = slice["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"].as_str().unwrap_or_default() == name)
            .and_then(|p| u16::try_from(p["port"].as_u64()?).ok());
        let Some(port) = port else { continue };
        for endpoint in slice["endpoints"].as_array().into_iter().flatten() {
            let conditions = &endpoint["conditions"];
            if conditions["ready"] == false || conditions["terminating"] == true {
                continue;
            }
            let addresses = endpoint["addresses"].as_array().into_iter().flatten();
            for address in addresses.filter_map(Value::as_str) {
                if let Ok(ip) = address.parse::<IpAddr>() {
                    out.push((ip, port));
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// One nft rule: `LB_IP:port` (of `protocol`, `tcp` or `udp`) to the endpoints, at random.
fn rule(lb: IpAddr, (protocol, port): (&str, u16), targets: &[(IpAddr, u16)]) -> Option<String> {
    if targets.is_empty() {
        return None;
    }
    let (family, daddr) = match lb {
        IpAddr::V4(_) => ("ip", "ip daddr"),
        IpAddr::V6(_) => ("ip6", "ip6 daddr"),
    };
    let elements: Vec<String> = targets
        .iter()
        .enumerate()
        .map(|(i, (ip, p))| format!("{i} : {ip} . {p}"))
        .collect();
    Some(format!(
        "{daddr} {lb} {protocol} dport {port} dnat {family} to numgen random mod {} map {{ {} }}",
        targets.len(),
        elements.join(", ")
    ))
}

/// The whole ruleset for both tables, rules by family.
fn ruleset(v4: &[String], v6: &[String]) -> String {
    let mut text = String::new();
    for (family, rules) in [("ip", v4), ("ip6", v6)] {
        // Declaring then deleting makes the replacement work whether or not the table exists.
        text.push_str(&format!(
            "table {family} duet_lb {{}}\ndelete table {family} duet_lb\n"
        ));
        text.push_str(&format!("table {family} duet_lb {{\n"));
        for (chain, hook) in [("prerouting", "prerouting"), ("output", "output")] {
            text.push_str(&format!(
                "  chain {chain} {{\n    type nat hook {hook} priority -100; policy accept;\n"
            ));
            for r in rules {
                text.push_str(&format!("    {r}\n"));
            }
            text.push_str("  }\n");
        }
        text.push_str("}\n");
    }
    text
}

fn apply_ruleset(text: &str) -> anyhow::Result<()> {
    let mut child = Command::new(NFT)
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context(
            "cannot run nft (Debian package nftables): LoadBalancer traffic is not forwarded",
        )?;
    child
        .stdin
        .take()
        .context("nft has no stdin")?
        .write_all(text.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "nft -f failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl State {
    fn new(api: KubeApi) -> State {
        State {
            api,
            assigned: HashMap::new(),
            foreign: HashSet::new(),
            ruleset: String::new(),
        }
    }

    /// One look at every LoadBalancer Service and, when there is one, every EndpointSlice. Only
    /// those Services are listed (a field selector), so a cluster holding thousands of other
    /// Services and slices (`benches/load/scale-kube.sh`) does not have them all listed and
    /// encoded every tick.
    async fn pass(&mut self) -> anyhow::Result<()> {
        let services = self
            .api
            .get_path("/api/v1/services?fieldSelector=spec.type%3DLoadBalancer")
            .await?;
        let services: Vec<&Value> = services["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| is_load_balancer(s))
            .collect();
        self.mark_foreign(&services);
        let services: Vec<&Value> = services
            .into_iter()
            .filter(|s| !self.foreign.contains(str_at(s, "/metadata/uid")))
            .collect();
        self.release_gone(&services);
        let slices = if services.is_empty() {
            Vec::new()
        } else {
            let slices = self
                .api
                .get_path("/apis/discovery.k8s.io/v1/endpointslices")
                .await?;
            slices["items"].as_array().cloned().unwrap_or_default()
        };
        let mut by_service: BTreeMap<(&str, &str), Vec<&Value>> = BTreeMap::new();
        for slice in &slices {
            let service = str_at(slice, "/metadata/labels/kubernetes.io~1service-name");
            by_service
                .entry((str_at(slice, "/metadata/namespace"), service))
                .or_default()
                .push(slice);
        }
        let (mut v4, mut v6) = (Vec::new(), Vec::new());
        for service in services {
            let assigned = self.assign(service)?;
            self.write_status(service, &assigned).await?;
            let key = (
                str_at(service, "/metadata/namespace"),
                str_at(service, "/metadata/name"),
            );
            let slices = by_service.get(&key).map(Vec::as_slice).unwrap_or_default();
            let cluster_ips = cluster_ips(service);
            for port in forwarded_ports(service) {
                let targets_v4 = endpoints(slices, "IPv4", &port.name);
                let targets_v6 = endpoints(slices, "IPv6", &port.name);
                let addresses = assigned.v4.map(IpAddr::from).into_iter();
                let addresses = addresses.chain(assigned.v6.map(IpAddr::from));
                for ip in addresses.chain(cluster_ips.iter().copied()) {
                    match ip {
                        IpAddr::V4(_) => {
                            v4.extend(rule(ip, (port.protocol, port.port), &targets_v4))
                        }
                        IpAddr::V6(_) => {
                            v6.extend(rule(ip, (port.protocol, port.port), &targets_v6))
                        }
                    }
                }
            }
        }
        let text = ruleset(&v4, &v6);
        if text != self.ruleset {
            apply_ruleset(&text)?;
            self.ruleset = text;
        }
        Ok(())
    }

    /// Notes the Services whose status holds addresses this controller did not give.
    fn mark_foreign(&mut self, services: &[&Value]) {
        for service in services {
            let uid = str_at(service, "/metadata/uid");
            let ingress = &service["status"]["loadBalancer"]["ingress"];
            let written = ingress.as_array().is_some_and(|i| !i.is_empty());
            let mine = self
                .assigned
                .get(uid)
                .is_some_and(|a| *ingress == Value::Array(ingress_of(service, a)));
            if written && !mine && self.foreign.insert(uid.to_owned()) {
                tracing::info!(
                    service = %format!("{}/{}", str_at(service, "/metadata/namespace"), str_at(service, "/metadata/name")),
                    "Load-balancer status written by someone else; left to them"
                );
            }
        }
        let live: HashSet<&str> = services
            .iter()
            .map(|s| str_at(s, "/metadata/uid"))
            .collect();
        self.foreign.retain(|uid| live.contains(uid.as_str()));
    }

    /// Frees the addresses of Services that are gone or no longer LoadBalancers.
    fn release_gone(&mut self, services: &[&Value]) {
        let live: Vec<&str> = services
            .iter()
            .map(|s| str_at(s, "/metadata/uid"))
            .collect();
        let gone: Vec<String> = self
            .assigned
            .keys()
            .filter(|uid| !live.contains(&uid.as_str()))
            .cloned()
            .collect();
        for uid in gone {
            if let Some(assigned) = self.assigned.remove(&uid) {
                let ips = [assigned.v4.map(IpAddr::V4), assigned.v6.map(IpAddr::V6)];
                for ip in ips.into_iter().flatten() {
                    if let Err(e) = local_address("del", ip) {
                        tracing::warn!(error = %format!("{e:#}"), "The load balancer could not remove an address");
                    }
                }
            }
        }
    }

    /// The Service's addresses: those it asks for with [`REQUESTED_IPS`] when they can be given
    /// (else none), or those given before plus one per family it gained.
    fn assign(&mut self, service: &Value) -> anyhow::Result<Assigned> {
        let uid = str_at(service, "/metadata/uid").to_owned();
        let families = families(service);
        let before = self.assigned.get(&uid).cloned().unwrap_or_default();
        if let Some(requested) = service["metadata"]["annotations"][REQUESTED_IPS].as_str() {
            let wanted = self
                .requested(&uid, requested, &families)
                .unwrap_or_default();
            self.replace(&uid, &before, &wanted)?;
            return Ok(wanted);
        }
        let mut assigned = before;
        if families.iter().any(|f| f == "IPv4") && assigned.v4.is_none() {
            let ip = self
                .free_v4()
                .context("the IPv4 load-balancer pool is exhausted")?;
            local_address("add", ip.into())?;
            assigned.v4 = Some(ip);
        }
        if families.iter().any(|f| f == "IPv6") && assigned.v6.is_none() {
            let ip = self
                .free_v6()
                .context("the IPv6 load-balancer pool is exhausted")?;
            local_address("add", ip.into())?;
            assigned.v6 = Some(ip);
        }
        self.assigned.insert(uid, assigned.clone());
        Ok(assigned)
    }

    /// The addresses a Service asks for (`a,b`), when they can all be given: one per family of
    /// the Service, each in the pool and held by no other Service (MetalLB gives all or none).
    fn requested(&self, uid: &str, requested: &str, families: &[String]) -> Option<Assigned> {
        let mut out = Assigned::default();
        for text in requested.split(',').map(str::trim) {
            match text.parse::<IpAddr>().ok()? {
                IpAddr::V4(ip) if out.v4.is_none() && in_pool_v4(ip) => out.v4 = Some(ip),
                IpAddr::V6(ip) if out.v6.is_none() && in_pool_v6(ip) => out.v6 = Some(ip),
                _ => return None,
            }
        }
        let has = |f: &str| families.iter().any(|x| x == f);
        let fits = out.v4.is_some() == has("IPv4") && out.v6.is_some() == has("IPv6");
        let taken = self.assigned.iter().any(|(other, a)| {
            other != uid
                && ((out.v4.is_some() && a.v4 == out.v4) || (out.v6.is_some() && a.v6 == out.v6))
        });
        (fits && !taken).then_some(out)
    }

    /// Moves a Service from the addresses it had to `wanted` (on the loopback and in the table).
    fn replace(&mut self, uid: &str, before: &Assigned, wanted: &Assigned) -> anyhow::Result<()> {
        let old = [before.v4.map(IpAddr::V4), before.v6.map(IpAddr::V6)];
        let new = [wanted.v4.map(IpAddr::V4), wanted.v6.map(IpAddr::V6)];
        for ip in old.iter().flatten().filter(|ip| !new.contains(&Some(**ip))) {
            local_address("del", *ip)?;
        }
        for ip in new.iter().flatten().filter(|ip| !old.contains(&Some(**ip))) {
            local_address("add", *ip)?;
        }
        self.assigned.insert(uid.to_owned(), wanted.clone());
        Ok(())
    }

    fn free_v4(&self) -> Option<Ipv4Addr> {
        (1..=POOL_V4_SIZE)
            .map(|i| Ipv4Addr::from(u32::from(POOL_V4_BASE) + i))
            .find(|ip| !self.assigned.values().any(|a| a.v4 == Some(*ip)))
    }

    fn free_v6(&self) -> Option<Ipv6Addr> {
        (1..=POOL_V6_SIZE)
            .map(|i| Ipv6Addr::from(u128::from(POOL_V6_BASE) + u128::from(i)))
            .find(|ip| !self.assigned.values().any(|a| a.v6 == Some(*ip)))
    }

    /// `status.loadBalancer.ingress` in the Service's family order, written when it differs.
    async fn write_status(&self, service: &Value, assigned: &Assigned) -> anyhow::Result<()> {
        let ingress = ingress_of(service, assigned);
        let current = &service["status"]["loadBalancer"]["ingress"];
        if *current == Value::Array(ingress.clone()) {
            return Ok(());
        }
        let path = format!(
            "/api/v1/namespaces/{}/services/{}/status",
            str_at(service, "/metadata/namespace"),
            str_at(service, "/metadata/name")
        );
        let patch = json!({
            "metadata": {"resourceVersion": str_at(service, "/metadata/resourceVersion")},
            "status": {"loadBalancer": {"ingress": ingress}},
        });
        let written = self
            .api
            .send(
                Method::PATCH,
                &path,
                "application/merge-patch+json",
                serde_json::to_vec(&patch)?,
            )
            .await;
        match written {
            Ok(_) => Ok(()),
            // Changed since it was read: the next pass looks again.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
            Err(e) => {
                Err(e).with_context(|| format!("cannot write the load-balancer status of {path}"))
            }
        }
    }
}

/// A Service's `spec.clusterIPs` (what a Gateway's status falls back to before the load balancer
/// answers): forwarded like its load-balancer addresses, as kube-proxy would.
fn cluster_ips(service: &Value) -> Vec<IpAddr> {
    let ips = service["spec"]["clusterIPs"]
        .as_array()
        .into_iter()
        .flatten();
    ips.filter_map(|ip| ip.as_str()?.parse().ok()).collect()
}

/// Makes the Service ranges routable inside the namespace (a `local` route on the loopback):
/// the nft rules then forward a Service's cluster IPs to its endpoints.
fn route_service_ranges() -> anyhow::Result<()> {
    ip(&[
        "route",
        "replace",
        "local",
        SERVICE_CIDR_V4,
        "dev",
        POD_INTERFACE,
    ])?;
    ip(&[
        "-6",
        "route",
        "replace",
        "local",
        SERVICE_CIDR_V6,
        "dev",
        POD_INTERFACE,
    ])
}

/// The `status.loadBalancer.ingress` entries for a Service's addresses, in its family order.
fn ingress_of(service: &Value, assigned: &Assigned) -> Vec<Value> {
    families(service)
        .iter()
        .filter_map(|f| match f.as_str() {
            "IPv4" => assigned.v4.map(|ip| ip.to_string()),
            "IPv6" => assigned.v6.map(|ip| ip.to_string()),
            _ => None,
        })
        .map(|ip| json!({"ip": ip, "ipMode": "VIP"}))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_pick_the_named_port_of_ready_endpoints_of_one_family() {
        let slice = |family: &str, addresses: &[&str], ready: bool| {
            json!({
                "addressType": family,
                "ports": [{"name": "other", "port": 1}, {"name": "port-80", "port": 20000}],
                "endpoints": addresses.iter().map(|a| json!({"addresses": [a], "conditions": {"ready": ready}})).collect::<Vec<_>>(),
            })
        };
        let v4 = slice("IPv4", &["10.244.0.2", "10.244.0.3"], true);
        let v4_down = slice("IPv4", &["10.244.0.9"], false);
        let v6 = slice("IPv6", &["fd00:10:244::2"], true);
        let slices = [&v4, &v4_down, &v6];
        assert_eq!(
            endpoints(&slices, "IPv4", "port-80"),
            [
                ("10.244.0.2".parse().unwrap(), 20000),
                ("10.244.0.3".parse().unwrap(), 20000)
            ]
        );
        let r = rule(
            "10.250.0.1".parse().unwrap(),
            ("tcp", 80),
            &endpoints(&slices, "IPv4", "port-80"),
        );
        assert_eq!(
            r.as_deref(),
            Some("ip daddr 10.250.0.1 tcp dport 80 dnat ip to numgen random mod 2 map { 0 : 10.244.0.2 . 20000, 1 : 10.244.0.3 . 20000 }")
        );
        let r6 = rule(
            "fd00:10:250::1".parse().unwrap(),
            ("udp", 443),
            &endpoints(&slices, "IPv6", "port-80"),
        );
        assert_eq!(
            r6.as_deref(),
            Some("ip6 daddr fd00:10:250::1 udp dport 443 dnat ip6 to numgen random mod 1 map { 0 : fd00:10:244::2 . 20000 }")
        );
        assert_eq!(rule("10.250.0.1".parse().unwrap(), ("tcp", 80), &[]), None);
    }
}
