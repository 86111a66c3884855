//! The backend phase: EndpointSlices -> one [`Target`] per pod, joined across the IPv4 and IPv6
//! slices of a Service, and one [`Backend`] per used Service port.
//!
//! Addresses duet never proxies to are dropped with a `ForbiddenEndpointAddress` diagnostic:
//! unspecified (`0.0.0.0/8`, `::`), link-local (`169.254.0.0/16`, so the cloud metadata address
//! `169.254.169.254`, and `fe80::/10`), multicast (`224.0.0.0/4`, `ff00::/8`) and broadcast
//! always, loopback (`127.0.0.0/8`, `::1`) unless [`Config::allow_loopback_endpoints`] (set in
//! `--manifests` mode). Whoever can write an EndpointSlice must not make duet reach the node's
//! own services or the metadata server (the class of CVE-2021-25740).
//!
//! A `service-upstream` backend (its spec holds the Service's cluster IPs) is one target holding
//! the cluster IP of each family instead of the pods; an ExternalName backend is one target
//! holding its name's addresses ([`external`](super::external)).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use dataplane::{Backend, BackendId, BackendMap, Family, Target, TargetId, TargetKey};

use super::external::external_target;
use super::{BackendSpec, Config, Diagnostic, Inputs, Reason, Resolved, RoutePlan};
use crate::compact::{EndpointView, SliceView};
use crate::object::{slice_service, Kind, NsName, ObjectKey};

/// Backend diagnostics by the Service whose backends they concern, each list sorted.
pub type ServiceDiagnostics = BTreeMap<NsName, Vec<Diagnostic>>;

/// The backend phase: builds every backend the plan uses from the EndpointSlices. A backend equal
/// by value to its entry in `previous` keeps the previous `Arc` (so the dataplane keeps its live
/// state object). Diagnostics are sorted and free of duplicates.
pub fn build_backends(
    plan: &RoutePlan,
    inputs: &Inputs<'_>,
    config: &Config,
    previous: &BackendMap<Arc<Backend>>,
) -> (BackendMap<Arc<Backend>>, Vec<Diagnostic>) {
    let (backends, by_service) =
        build_backends_by_service(plan, &inputs.slices(), inputs.names, config, previous);
    let mut diagnostics: Vec<Diagnostic> = by_service.into_values().flatten().collect();
    diagnostics.sort();
    diagnostics.dedup();
    (backends, diagnostics)
}

/// [`build_backends`] with the diagnostics kept by Service, for [`update_backends`] to replace
/// one Service's later.
pub fn build_backends_by_service(
    plan: &RoutePlan,
    endpoint_slices: &[&dyn SliceView],
    names: Option<&Resolved>,
    config: &Config,
    previous: &BackendMap<Arc<Backend>>,
) -> (BackendMap<Arc<Backend>>, ServiceDiagnostics) {
    let used: BTreeSet<&NsName> = plan.backends.values().map(|s| &s.service).collect();
    let mut slices: BTreeMap<NsName, Vec<&dyn SliceView>> = BTreeMap::new();
    for slice in endpoint_slices {
        if let Some(service) = slice_service(*slice) {
            if used.contains(&service) {
                slices.entry(service).or_default().push(*slice);
            }
        }
    }
    let specs: Vec<(&BackendId, &BackendSpec)> =
        plan.backends.iter().map(|(id, s)| (id, &**s)).collect();
    let slices_of = |service: &NsName| slices.get(service).cloned().unwrap_or_default();
    let mut built = Built::with_capacity(specs.len());
    built.add(&specs, &slices_of, names, config, previous);
    (built.backends, built.diagnostics)
}

/// [`build_backends_by_service`] reading each used Service's slices through `slices_of` (the
/// index's Service-to-slices map) instead of grouping every stored slice. With many backends
/// the work is shared by the machine's cores (scoped threads, no runtime): the backends, cut
/// into runs that never split a Service, are taken run by run by whichever thread is free, so
/// that no core waits for another that drew slower Services. The result is the same as on one.
pub fn build_backends_with<'a, S: SliceView + Sync + ?Sized + 'a>(
    plan: &RoutePlan,
    slices_of: impl Fn(&NsName) -> Vec<&'a S> + Sync,
    names: Option<&Resolved>,
    config: &Config,
    previous: &BackendMap<Arc<Backend>>,
) -> (BackendMap<Arc<Backend>>, ServiceDiagnostics) {
    let threads = parallel_parts(plan.backends.len());
    build_backends_on(threads, plan, slices_of, names, config, previous)
}

/// [`build_backends_with`] on `threads` threads.
fn build_backends_on<'a, S: SliceView + Sync + ?Sized + 'a>(
    threads: usize,
    plan: &RoutePlan,
    slices_of: impl Fn(&NsName) -> Vec<&'a S> + Sync,
    names: Option<&Resolved>,
    config: &Config,
    previous: &BackendMap<Arc<Backend>>,
) -> (BackendMap<Arc<Backend>>, ServiceDiagnostics) {
    let specs: Vec<(&BackendId, &BackendSpec)> =
        plan.backends.iter().map(|(id, s)| (id, &**s)).collect();
    if threads <= 1 {
        let mut built = Built::with_capacity(specs.len());
        built.add(&specs, &slices_of, names, config, previous);
        return (built.backends, built.diagnostics);
    }
    let runs = split_by_service(&specs, threads * RUNS_PER_THREAD);
    let next = std::sync::atomic::AtomicUsize::new(0);
    // The thread that keeps its map sizes it for every backend: the others' entries join it
    // without growing it.
    let work = |capacity: usize| {
        let mut built = Built::with_capacity(capacity);
        loop {
            let taken = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some(run) = runs.get(taken) else {
                break built;
            };
            built.add(run, &slices_of, names, config, previous);
        }
    };
    let (mut all, others) = std::thread::scope(|scope| {
        let others: Vec<_> = (1..threads)
            .map(|_| scope.spawn(|| work(specs.len() / threads)))
            .collect();
        let mine = work(specs.len());
        let others: Vec<Built> = others
            .into_iter()
            .map(|h| h.join().expect("a backend part"))
            .collect();
        (mine, others)
    });
    for more in others {
        all.backends.extend(more.backends);
        // A Service's backends are in one run: no Service's diagnostics are in two parts.
        all.diagnostics.extend(more.diagnostics);
    }
    (all.backends, all.diagnostics)
}

/// Runs per thread [`build_backends_with`] cuts the backends into: enough that the threads
/// finish within a run of each other, few enough that taking one costs nothing.
const RUNS_PER_THREAD: usize = 16;

/// Backends per part below which the backend phase stays on one thread (a thread costs tens of
/// microseconds; a backend of ten pods a few).
const MIN_BACKENDS_PER_PART: usize = 2048;

/// Into how many parts a backend phase of `backends` is split: one per core, each of at least
/// [`MIN_BACKENDS_PER_PART`].
fn parallel_parts(backends: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    cores.min(backends / MIN_BACKENDS_PER_PART).max(1)
}

/// `specs` (sorted by id) cut into about `parts` runs of equal length, never between two
/// backends of one Service (whose diagnostics are kept together).
fn split_by_service<'s, 'p>(
    specs: &'s [(&'p BackendId, &'p BackendSpec)],
    parts: usize,
) -> Vec<&'s [(&'p BackendId, &'p BackendSpec)]> {
    let mut chunks = Vec::with_capacity(parts);
    let mut rest = specs;
    for left in (1..=parts).rev() {
        if left == 1 || rest.is_empty() {
            chunks.push(rest);
            break;
        }
        let mut cut = rest.len() / left;
        while cut > 0 && cut < rest.len() && rest[cut].1.service == rest[cut - 1].1.service {
            cut += 1;
        }
        let (head, tail) = rest.split_at(cut.min(rest.len()));
        chunks.push(head);
        rest = tail;
    }
    chunks
}

/// What one thread of the backend phase built: backends and their Services' diagnostics, zone
/// names shared among its targets.
struct Built {
    backends: BackendMap<Arc<Backend>>,
    diagnostics: ServiceDiagnostics,
    zones: Zones,
}

impl Built {
    fn with_capacity(capacity: usize) -> Built {
        Built {
            backends: BackendMap::with_capacity(capacity),
            diagnostics: ServiceDiagnostics::new(),
            zones: Zones::default(),
        }
    }

    /// Builds the backends of a run of `specs` (sorted by id: a Service's are adjacent).
    fn add<'a, S: SliceView + ?Sized + 'a>(
        &mut self,
        specs: &[(&BackendId, &BackendSpec)],
        slices_of: &impl Fn(&NsName) -> Vec<&'a S>,
        names: Option<&Resolved>,
        config: &Config,
        previous: &BackendMap<Arc<Backend>>,
    ) {
        let mut current: Option<(&NsName, Vec<&S>)> = None;
        for &(id, spec) in specs {
            if current.as_ref().is_none_or(|(s, _)| **s != spec.service) {
                current = Some((&spec.service, slices_of(&spec.service)));
            }
            let slices = current
                .as_ref()
                .map(|(_, v)| v.as_slice())
                .unwrap_or_default();
            let (backend, found) =
                backend_of(id, spec, slices, names, config, previous, &mut self.zones);
            add_diagnostics(&mut self.diagnostics, &spec.service, found);
            self.backends.insert(id.clone(), backend);
        }
    }
}

/// The plan's backends on ports of `service`, found by id (`namespace/service:port`, sorted).
fn service_backends<'p>(
    plan: &'p RoutePlan,
    service: &'p NsName,
) -> impl Iterator<Item = (&'p BackendId, &'p BackendSpec)> + 'p {
    let from = BackendId::new(&service.namespace, &service.name, "");
    let prefix = from.as_str().to_owned();
    plan.backends
        .range(from..)
        .take_while(move |(id, _)| id.as_str().starts_with(&prefix))
        .filter(move |(_, spec)| spec.service == *service)
        .map(|(id, spec)| (id, &**spec))
}

/// The ids of the plan's backends on ports of the `services`.
pub fn backends_of(plan: &RoutePlan, services: &BTreeSet<NsName>) -> Vec<BackendId> {
    services
        .iter()
        .flat_map(|service| service_backends(plan, service).map(|(id, _)| id.clone()))
        .collect()
}

/// The backends after an endpoint-only change: the backends of the `changed` Services are built
/// again from `slices_of` (their EndpointSlices), every other backend is `previous`'s `Arc`
/// (never looked at); `diagnostics` (by Service) is updated in place. `None` when `previous`
/// does not hold exactly the plan's backends (then a whole [`build_backends_by_service`] is due).
pub fn update_backends<'a, S: SliceView + ?Sized + 'a>(
    plan: &RoutePlan,
    changed: &BTreeSet<NsName>,
    slices_of: impl Fn(&NsName) -> Vec<&'a S>,
    names: Option<&Resolved>,
    config: &Config,
    previous: &BackendMap<Arc<Backend>>,
    diagnostics: &mut ServiceDiagnostics,
) -> Option<BackendMap<Arc<Backend>>> {
    if previous.len() != plan.backends.len() {
        return None;
    }
    let mut backends = previous.clone();
    let mut zones = Zones::default();
    for service in changed {
        diagnostics.remove(service);
        let slices = slices_of(service);
        for (id, spec) in service_backends(plan, service) {
            if !previous.contains_key(id) {
                return None;
            }
            let (backend, found) =
                backend_of(id, spec, &slices, names, config, previous, &mut zones);
            add_diagnostics(diagnostics, service, found);
            backends.insert(id.clone(), backend);
        }
    }
    Some(backends)
}

/// The backends after a route change planned host by host ([`super::incremental`]): a backend
/// whose spec is as in the `old` plan, of a Service whose endpoints did not change (`endpoints`),
/// is `previous`'s `Arc`; every backend of the other Services (new, changed or dropped specs,
/// changed endpoints) is built again and their `diagnostics` replaced. Equal to
/// [`build_backends_with`] when `previous` and `diagnostics` were built for `old`.
#[allow(clippy::too_many_arguments)]
pub fn update_backends_after_routes<'a, S: SliceView + ?Sized + 'a>(
    plan: &RoutePlan,
    old: &RoutePlan,
    endpoints: &BTreeSet<NsName>,
    slices_of: impl Fn(&NsName) -> Vec<&'a S>,
    names: Option<&Resolved>,
    config: &Config,
    previous: &BackendMap<Arc<Backend>>,
    diagnostics: &mut ServiceDiagnostics,
) -> BackendMap<Arc<Backend>> {
    let mut again: BTreeSet<&NsName> = endpoints.iter().collect();
    // Both plans' backends are sorted by id: walked together (two lookups of each of the
    // 10,000 ids at the 10k-Ingress size were a third of this phase after an Ingress change).
    let mut olds = old.backends.iter().peekable();
    for (id, spec) in &plan.backends {
        while let Some((_, gone)) = olds.next_if(|(old_id, _)| *old_id < id) {
            again.insert(&gone.service);
        }
        let was = olds.next_if(|(old_id, _)| *old_id == id).map(|(_, s)| s);
        if was != Some(spec) || !previous.contains_key(id) {
            again.insert(&spec.service);
        }
    }
    for (_, gone) in olds {
        again.insert(&gone.service);
    }
    if !diagnostics.is_empty() {
        let used: BTreeSet<&NsName> = plan.backends.values().map(|s| &s.service).collect();
        diagnostics.retain(|service, _| used.contains(service) && !again.contains(service));
    }
    let mut backends = BackendMap::with_capacity(plan.backends.len());
    for (id, spec) in &plan.backends {
        if let (false, Some(backend)) = (again.contains(&spec.service), previous.get(id)) {
            backends.insert(id.clone(), backend.clone());
        }
    }
    let mut zones = Zones::default();
    for service in again {
        let slices = slices_of(service);
        for (id, spec) in service_backends(plan, service) {
            let (backend, found) =
                backend_of(id, spec, &slices, names, config, previous, &mut zones);
            add_diagnostics(diagnostics, service, found);
            backends.insert(id.clone(), backend);
        }
    }
    backends
}

/// One backend from its Service's slices; `previous`'s `Arc` when equal by value.
fn backend_of<S: SliceView + ?Sized>(
    id: &BackendId,
    spec: &BackendSpec,
    slices: &[&S],
    names: Option<&Resolved>,
    config: &Config,
    previous: &BackendMap<Arc<Backend>>,
    zones: &mut Zones,
) -> (Arc<Backend>, Vec<Diagnostic>) {
    let allow_loopback = config.allow_loopback_endpoints;
    let (targets, found) = match &spec.external_name {
        Some(name) => external_target(spec, name, names, allow_loopback),
        None if spec.cluster_ips.is_empty() => {
            join_targets_with(slices, &spec.port_name, allow_loopback, zones)
        }
        None => cluster_target(spec, allow_loopback),
    };
    let backend = Backend {
        id: id.clone(),
        targets: targets.into(),
        lb: config.lb,
        protocol: spec.protocol,
    };
    let backend = match previous.get(id) {
        Some(old) if **old == backend => old.clone(),
        _ => Arc::new(backend),
    };
    (backend, found)
}

/// Adds a backend's diagnostics to its Service's, sorted, without duplicates.
fn add_diagnostics(all: &mut ServiceDiagnostics, service: &NsName, found: Vec<Diagnostic>) {
    if found.is_empty() {
        return;
    }
    let list = all.entry(service.clone()).or_default();
    list.extend(found);
    list.sort();
    list.dedup();
}

/// The one target of a `service-upstream` backend: the Service's cluster IP of each family at the
/// Service port; forbidden addresses are dropped with a diagnostic.
fn cluster_target(spec: &BackendSpec, allow_loopback: bool) -> (Vec<Target>, Vec<Diagnostic>) {
    let mut diagnostics = Vec::new();
    let port = u16::try_from(spec.port).unwrap_or_default();
    let mut target = Target::new(TargetId(format!("service/{}", spec.service).into()));
    for ip in &spec.cluster_ips {
        if let Some(class) = forbidden(*ip, allow_loopback) {
            diagnostics.push(Diagnostic::new(
                ObjectKey::new(Kind::Service, &*spec.service.namespace, &*spec.service.name),
                Reason::ForbiddenEndpointAddress,
                format!("cluster IP {ip} is {class}; duet does not proxy to it (service-upstream)"),
            ));
            continue;
        }
        target.add_addr(SocketAddr::new(*ip, port));
    }
    let targets = if target.has_addr() {
        vec![target]
    } else {
        Vec::new()
    };
    (targets, diagnostics)
}

#[derive(Default)]
struct Joined {
    v4: Option<SocketAddr>,
    v6: Option<SocketAddr>,
    zone: Option<Arc<str>>,
}

/// Joins the EndpointSlices of one Service into targets for the Service port named `port_name`
/// (`""` for an unnamed port):
///
/// - per slice, the endpoint port is the slice port with that name;
/// - endpoints with a `targetRef` are joined into ONE target per pod, keyed by `targetRef.uid`
///   (fallback `kind/namespace/name`), so a dual-stack pod listed in an IPv4 and an IPv6 slice is
///   one target with both addresses;
/// - endpoints without a `targetRef` are single-family targets identified by their address;
/// - only ready (unset = ready) and not terminating endpoints serve;
/// - targets are sorted by id.
///
/// Slices of address type `FQDN`, addresses that do not parse, [`forbidden`] addresses (loopback
/// only unless `allow_loopback`) and slices lacking the port are skipped with a diagnostic.
pub fn join_targets<S: SliceView + ?Sized>(
    slices: &[&S],
    port_name: &str,
    allow_loopback: bool,
) -> (Vec<Target>, Vec<Diagnostic>) {
    join_targets_with(slices, port_name, allow_loopback, &mut Zones::default())
}

/// The zone names targets share: a cluster has a few zones and every pod names one (100,000
/// targets at the 10k-Ingress size, each a 32-byte allocation of its own before). Up to
/// [`Zones::MAX`] distinct names are shared; more (never seen in a real cluster, possible in
/// a hostile slice) get an allocation each rather than a longer search.
#[derive(Debug, Default)]
pub(crate) struct Zones(Vec<Arc<str>>);

impl Zones {
    const MAX: usize = 32;

    fn get(&mut self, zone: &str) -> Arc<str> {
        if let Some(known) = self.0.iter().find(|z| z.as_ref() == zone) {
            return known.clone();
        }
        let new: Arc<str> = zone.into();
        if self.0.len() < Self::MAX {
            self.0.push(new.clone());
        }
        new
    }
}

/// [`join_targets`] sharing zone names through `zones`.
fn join_targets_with<S: SliceView + ?Sized>(
    slices: &[&S],
    port_name: &str,
    allow_loopback: bool,
    zones: &mut Zones,
) -> (Vec<Target>, Vec<Diagnostic>) {
    let mut sorted: Vec<&S> = slices.to_vec();
    sorted.sort_by(|a, b| (a.namespace(), a.name()).cmp(&(b.namespace(), b.name())));
    let mut diagnostics = Vec::new();
    let mut joined: BTreeMap<TargetKey, Joined> = BTreeMap::new();
    for slice in sorted {
        // Made only for a diagnostic: most slices have none.
        let key = || ObjectKey::new(Kind::EndpointSlice, slice.namespace(), slice.name());
        let Some((family, port)) = family_and_port(slice, &key, port_name, &mut diagnostics) else {
            continue;
        };
        slice.for_each_endpoint(&mut |endpoint| {
            let Some(addr) = serving_address(
                &endpoint,
                (&key, slice.address_type()),
                (family, port),
                allow_loopback,
                &mut diagnostics,
            ) else {
                return;
            };
            // A pod uid's key is kept inline: no allocation per endpoint.
            let id = match &endpoint.target {
                Some(target) => target.key(),
                None => TargetKey::new(&addr.to_string()),
            };
            joined
                .entry(id)
                .or_default()
                .add(family, addr, endpoint.zone, zones);
        });
    }
    let targets = joined
        .into_iter()
        .map(|(id, j)| Target::with_addrs(TargetId(id), j.v4.into_iter().chain(j.v6), j.zone))
        .collect();
    (targets, diagnostics)
}

impl Joined {
    /// Adds an endpoint's address of `family` (the first one of each family wins) and zone.
    fn add(&mut self, family: Family, addr: SocketAddr, zone: Option<&str>, zones: &mut Zones) {
        let slot = match family {
            Family::V4 => &mut self.v4,
            Family::V6 => &mut self.v6,
        };
        if slot.is_none() {
            *slot = Some(addr);
        }
        if self.zone.is_none() {
            self.zone = zone.map(|z| zones.get(z));
        }
    }
}

/// The family of a slice and its TCP port named `port_name`; `None`, with a diagnostic unless
/// the slice is simply empty, when the slice has nothing to serve.
fn family_and_port<S: SliceView + ?Sized>(
    slice: &S,
    key: &dyn Fn() -> ObjectKey,
    port_name: &str,
    diagnostics: &mut Vec<Diagnostic>,
) -> Option<(Family, u16)> {
    let family = match slice.address_type() {
        "IPv4" => Family::V4,
        "IPv6" => Family::V6,
        other => {
            diagnostics.push(Diagnostic::new(
                key(),
                Reason::UnsupportedAddressType,
                format!(
                    "addressType {other:?} is not supported (only IPv4 and IPv6); slice skipped"
                ),
            ));
            return None;
        }
    };
    // The endpointslice controller keeps an empty slice per family, without ports, when no
    // pod has an address of that family (or none is left): nothing to route, nothing wrong.
    if slice.has_no_endpoints() {
        return None;
    }
    let Some(port) = slice.tcp_port(port_name) else {
        diagnostics.push(Diagnostic::new(
            key(),
            Reason::UnknownEndpointPort,
            format!(
                "no TCP port named {port_name:?} (the Service port's name); slice skipped for it"
            ),
        ));
        return None;
    };
    Some((family, port))
}

/// The address an endpoint serves on, if it serves: ready, not terminating, an address of the
/// slice's family that duet may proxy to (a diagnostic otherwise).
fn serving_address(
    endpoint: &EndpointView<'_>,
    (key, address_type): (&dyn Fn() -> ObjectKey, &str),
    (family, port): (Family, u16),
    allow_loopback: bool,
    diagnostics: &mut Vec<Diagnostic>,
) -> Option<SocketAddr> {
    if !endpoint.ready || endpoint.terminating {
        return None;
    }
    let written = endpoint.address?;
    let ip = match written.ip() {
        Some(ip) if Family::of_ip(&ip) == family => ip.to_canonical(),
        _ => {
            diagnostics.push(Diagnostic::new(
                key(),
                Reason::InvalidEndpoint,
                format!(
                    "address {:?} is not an {address_type} address; endpoint skipped",
                    written.to_string()
                ),
            ));
            return None;
        }
    };
    if let Some(class) = forbidden(ip, allow_loopback) {
        diagnostics.push(Diagnostic::new(
            key(),
            Reason::ForbiddenEndpointAddress,
            format!("address {ip} is {class}; duet does not proxy to it, endpoint dropped"),
        ));
        return None;
    }
    Some(SocketAddr::new(ip, port))
}

/// Why duet refuses to proxy to `ip` (already canonical: IPv4-mapped addresses are IPv4), or
/// `None` when it may.
pub fn forbidden(ip: IpAddr, allow_loopback: bool) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => {
            let [first, ..] = v4.octets();
            if first == 0 {
                Some("unspecified")
            } else if v4.is_loopback() {
                (!allow_loopback).then_some("loopback")
            } else if v4.is_link_local() {
                Some("link-local")
            } else if v4.is_multicast() {
                Some("multicast")
            } else if v4.is_broadcast() {
                Some("broadcast")
            } else {
                None
            }
        }
        IpAddr::V6(v6) => {
            if v6.is_unspecified() {
                Some("unspecified")
            } else if v6.is_loopback() {
                (!allow_loopback).then_some("loopback")
            } else if v6.segments()[0] & 0xffc0 == 0xfe80 {
                Some("link-local")
            } else if v6.is_multicast() {
                Some("multicast")
            } else {
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::{
        build_backends_by_service, build_backends_on, forbidden, join_targets_with,
        split_by_service, Zones,
    };
    use crate::compact::{Slice, SliceView};
    use crate::object::NsName;
    use crate::translate::{BackendSpec, Config, RoutePlan};
    use dataplane::{BackendId, BackendMap};

    /// A stored IPv4 slice of Service `service` whose pods `first..first + zones.len()` are in
    /// `zones`.
    fn zoned_slice(service: &str, first: usize, zones: &[String]) -> Slice {
        let mut yaml = format!(
            "metadata: {{name: {service}-v4, namespace: ns, labels: {{kubernetes.io/service-name: {service}}}}}\naddressType: IPv4\nports: [{{name: http, port: 80}}]\nendpoints:\n"
        );
        for (i, zone) in zones.iter().enumerate() {
            let pod = first + i;
            yaml += &format!(
                "  - {{addresses: [\"10.0.{}.{}\"], zone: {zone}, targetRef: {{uid: pod-{pod}}}}}\n",
                pod / 250,
                pod % 250 + 1
            );
        }
        serde_saphyr::from_str(&yaml).expect("a slice")
    }

    #[test]
    fn backends_built_on_several_threads_are_those_built_on_one() {
        // 90 Services of one to three ports, some slices without the port's name (a
        // diagnostic of their Service) and some Services without slices.
        let zones: Vec<String> = (0..4).map(|i| format!("zone-{}", i % 2)).collect();
        let mut plan = RoutePlan::default();
        let mut slices = Vec::new();
        for k in 0..90 {
            let service = format!("s{k:02}");
            for port in 0..(k % 3 + 1) {
                let spec = BackendSpec {
                    service: NsName::new("ns", &*service),
                    port_name: if port == 2 {
                        "admin".into()
                    } else {
                        "http".into()
                    },
                    port: 80 + port,
                    protocol: Default::default(),
                    cluster_ips: Vec::new(),
                    external_name: None,
                };
                let id = BackendId::new("ns", &service, &spec.port.to_string());
                plan.backends.insert(id, Arc::new(spec));
            }
            if k % 7 != 0 {
                slices.push(zoned_slice(&service, 4 * k as usize, &zones));
            }
        }
        let views: Vec<&dyn SliceView> = slices.iter().map(|s| s as &dyn SliceView).collect();
        let slices_of = |service: &NsName| -> Vec<&Slice> {
            let of = |s: &&Slice| s.service() == Some(service.name.as_str());
            slices.iter().filter(of).collect()
        };
        let config = Config::default();
        let none = BackendMap::new();
        let (one, one_found) = build_backends_by_service(&plan, &views, None, &config, &none);
        assert!(one.values().any(|b| !b.targets.is_empty()));
        assert!(one_found.values().flatten().count() >= 20, "{one_found:?}");
        for threads in [1, 2, 3] {
            let (many, found) = build_backends_on(threads, &plan, slices_of, None, &config, &none);
            assert!(many == one, "{threads} threads: the same backends");
            assert_eq!(found, one_found, "{threads} threads: the same diagnostics");
        }
    }

    #[test]
    fn targets_share_their_zone_names_across_backends() {
        let zones: Vec<String> = (0..6).map(|i| format!("zone-{}", i % 3)).collect();
        let (web, api) = (zoned_slice("web", 0, &zones), zoned_slice("api", 6, &zones));
        let mut shared = Zones::default();
        let (mut targets, diagnostics) = join_targets_with(&[&web], "http", false, &mut shared);
        assert!(diagnostics.is_empty(), "{diagnostics:?}");
        targets.extend(join_targets_with(&[&api], "http", false, &mut shared).0);
        assert_eq!(targets.len(), 12);
        for target in &targets {
            let pod: usize = target.id.to_string()["pod-".len()..].parse().unwrap();
            let zone = target.zone.as_ref().expect("a zone");
            assert_eq!(**zone, *format!("zone-{}", pod % 3));
            // One allocation per zone name for all of them.
            let first = targets[pod % 3].zone.as_ref().unwrap();
            assert!(Arc::ptr_eq(zone, first), "{} of pod-{pod}", zone);
        }
    }

    #[test]
    fn zones_past_the_shared_ones_keep_their_names() {
        let zones: Vec<String> = (0..Zones::MAX + 8).map(|i| format!("z{i}")).collect();
        let slice = zoned_slice("many", 0, &zones);
        let mut shared = Zones::default();
        for _ in 0..2 {
            let (targets, _) = join_targets_with(&[&slice], "http", false, &mut shared);
            assert_eq!(targets.len(), zones.len());
            for target in &targets {
                let pod: usize = target.id.to_string()["pod-".len()..].parse().unwrap();
                assert_eq!(target.zone.as_deref(), Some(&*format!("z{pod}")));
            }
        }
        assert_eq!(shared.0.len(), Zones::MAX);
    }

    #[test]
    fn parts_of_the_backend_phase_cover_every_backend_and_never_split_a_service() {
        // Service k has k % 3 + 1 ports: the even cuts fall inside Services.
        let mut owned = Vec::new();
        for k in 0..40 {
            for port in 0..(k % 3 + 1) {
                let spec = BackendSpec {
                    service: NsName::new("ns", format!("s{k:02}")),
                    port_name: String::new(),
                    port: 80 + port,
                    protocol: Default::default(),
                    cluster_ips: Vec::new(),
                    external_name: None,
                };
                let id = BackendId::new("ns", &format!("s{k:02}"), &spec.port.to_string());
                owned.push((id, spec));
            }
        }
        let specs: Vec<_> = owned.iter().map(|(id, spec)| (id, spec)).collect();
        for parts in 1..=7 {
            let chunks = split_by_service(&specs, parts);
            assert!(chunks.len() <= parts, "{parts} parts: {}", chunks.len());
            let joined: Vec<_> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
            assert_eq!(joined, specs, "{parts} parts cover every backend, in order");
            for pair in chunks.windows(2) {
                if let (Some(last), Some(first)) = (pair[0].last(), pair[1].first()) {
                    assert_ne!(last.1.service, first.1.service, "{parts} parts");
                }
            }
        }
    }

    #[test]
    fn forbidden_classes_over_both_families() {
        let cases = [
            ("127.0.0.1", Some("loopback")),
            ("127.9.9.9", Some("loopback")),
            ("::1", Some("loopback")),
            ("0.0.0.0", Some("unspecified")),
            ("0.1.2.3", Some("unspecified")),
            ("::", Some("unspecified")),
            ("169.254.169.254", Some("link-local")),
            ("169.254.0.1", Some("link-local")),
            ("fe80::1", Some("link-local")),
            ("febf::1", Some("link-local")),
            ("224.0.0.1", Some("multicast")),
            ("239.255.255.250", Some("multicast")),
            ("ff02::1", Some("multicast")),
            ("255.255.255.255", Some("broadcast")),
            ("10.0.0.1", None),
            ("192.0.2.1", None),
            ("fd00::1", None),
            ("2001:db8::1", None),
            ("fec0::1", None),
        ];
        for (ip, want) in cases {
            let ip: std::net::IpAddr = ip.parse().unwrap();
            assert_eq!(forbidden(ip, false), want, "{ip}");
            let allowed = if want == Some("loopback") { None } else { want };
            assert_eq!(forbidden(ip, true), allowed, "{ip} with loopback allowed");
        }
    }
}
