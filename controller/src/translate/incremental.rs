//! The route phase for an Ingress change, host by host: each route build records what every
//! Ingress contributed (its [`Footprint`]: the hosts it touched, what it references, whether it
//! reaches beyond its hosts), so that when only Ingresses changed, [`plan_ingress_change`] runs
//! the route phase over just the Ingresses sharing a host with the changed ones (old and new
//! hosts, closed over every host those Ingresses touch), takes those hosts' entries from it and
//! keeps every other host's entry, the certificates and the Gateway API tables of the previous
//! plan by pointer. The result equals a full [`plan_routes`](super::plan_routes) of the same
//! inputs; whenever that cannot be shown cheaply (an Ingress with `ssl-passthrough`, a `spec.tls`
//! host that is not a DNS name or `*.` wildcard, or a problem reported on another object than
//! itself; too many Ingresses involved) it returns `None` and the caller runs the full route
//! phase.
//!
//! - `spec.tls` hosts count among the hosts an Ingress touches: the certificate of a host is
//!   that of the oldest Ingress listing it, so every Ingress listing it is run again with the
//!   changed one, and the certificate table takes those hosts' entries from the partial run.
//! - The default backend is the oldest resolving `defaultBackend`: when the changed Ingresses
//!   have or had one, every Ingress with a `defaultBackend` is run again and the table takes
//!   the partial run's default backend.
//! - A change of a Service or Secret that only Ingresses read ([`changed_ingresses`]) is planned
//!   as a change of every Ingress that read it: the route phase runs over those (and the Ingresses
//!   sharing their hosts), which read the object again.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use dataplane::table::CertTable;
use dataplane::table::{HostRules, RouteAction};
use dataplane::{BackendId, Origin, RouteTable};

use super::routes::HostKey;
use super::{BackendSpec, Config, Diagnostic, Inputs, References, RoutePlan};
use crate::object::{Kind, NsName};
use crate::stored::StoredIngress;

/// What one of our Ingresses contributed to a route build.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Footprint {
    origin: Origin,
    /// Every host its rules touched (added to, read, or turned to regexes).
    hosts: Box<[HostKey]>,
    services: Box<[NsName]>,
    secrets: Box<[NsName]>,
    /// Whether it was taken into the references' Ingresses (its annotations allowed it).
    referenced: bool,
    /// Whether it has a `defaultBackend` (that may claim the table's default backend).
    default_backend: bool,
    /// Whether it reaches beyond its hosts: `ssl-passthrough`, a `spec.tls` host that is not a
    /// host key, or a diagnostic of another object than itself.
    global: bool,
}

/// The footprints of one route build.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Footprints {
    by_ingress: BTreeMap<NsName, Arc<Footprint>>,
    /// The references made outside any Ingress (the default TLS Secret, Gateway API routes).
    base: References,
}

impl Footprints {
    /// The references of the whole build: the base and every Ingress's.
    pub(crate) fn references(&self) -> References {
        // Collected, then built at once (sorted, deduplicated, bulk-loaded), not inserted one by
        // one: the footprints are in name order, and so are, mostly, the Services they name, so
        // the sort finds runs where 20,000 inserts each searched the tree.
        let prints = self.by_ingress.iter();
        let ingresses = prints.filter(|(_, p)| p.referenced).map(|(name, _)| name);
        let services = self.by_ingress.values().flat_map(|p| p.services.iter());
        let secrets = self.by_ingress.values().flat_map(|p| p.secrets.iter());
        References {
            ingresses: self
                .base
                .ingresses
                .iter()
                .chain(ingresses)
                .cloned()
                .collect(),
            services: self.base.services.iter().chain(services).cloned().collect(),
            secrets: self.base.secrets.iter().chain(secrets).cloned().collect(),
        }
    }
}

/// Records footprints while the Ingress processor runs; see [`Translation`](super::translation).
#[derive(Debug, Default)]
pub(crate) struct Recorder {
    current: Option<Open>,
    /// Hosts touched by rules held back until every Ingress is read, by Ingress.
    late: BTreeMap<NsName, BTreeSet<HostKey>>,
    done: BTreeMap<NsName, Footprint>,
}

#[derive(Debug)]
struct Open {
    name: NsName,
    origin: Origin,
    hosts: BTreeSet<HostKey>,
    /// The references made before this Ingress (restored when it ends).
    saved: References,
    diagnostics_from: usize,
    default_backend: bool,
    global: bool,
}

impl Recorder {
    /// An Ingress starts; `references` is set aside so that what it references is its own.
    pub(crate) fn begin(
        &mut self,
        origin: &Origin,
        ingress: &StoredIngress,
        references: &mut References,
        diagnostics: usize,
    ) {
        let spec = ingress.spec.as_ref();
        let default_backend = spec.is_some_and(|s| s.default_backend.is_some());
        // The certificate table's entries of its `spec.tls` hosts are its hosts too.
        let mut hosts = BTreeSet::new();
        let mut global = false;
        let tls = spec.and_then(|s| s.tls.as_ref()).into_iter().flatten();
        for host in tls.flat_map(|t| t.hosts.iter().flatten()) {
            // `parse` trims; a blank host (no certificate entry) is `Any`.
            match HostKey::parse(Some(host)) {
                Ok(HostKey::Any) => {}
                Ok(key) => {
                    hosts.insert(key);
                }
                Err(_) => global = true,
            }
        }
        self.current = Some(Open {
            name: NsName::new(&*origin.namespace, &*origin.name),
            origin: origin.clone(),
            hosts,
            saved: std::mem::take(references),
            diagnostics_from: diagnostics,
            default_backend,
            global,
        });
    }

    /// The current Ingress touches `host`.
    pub(crate) fn touch(&mut self, host: &HostKey) {
        if let Some(open) = &mut self.current {
            open.hosts.insert(host.clone());
        }
    }

    /// The current Ingress reaches beyond its hosts.
    pub(crate) fn global(&mut self) {
        if let Some(open) = &mut self.current {
            open.global = true;
        }
    }

    /// A rule of `origin` held back until every Ingress was read touches `host`.
    pub(crate) fn touch_late(&mut self, origin: &Origin, host: &HostKey) {
        let name = NsName::new(&*origin.namespace, &*origin.name);
        self.late.entry(name).or_default().insert(host.clone());
    }

    /// The current Ingress ends; `references` is again what was made outside any Ingress.
    pub(crate) fn end(&mut self, references: &mut References, diagnostics: &[Diagnostic]) {
        let Some(open) = self.current.take() else {
            return;
        };
        let name = open.name;
        let own = diagnostics[open.diagnostics_from..]
            .iter()
            .all(|d| d.object.kind == Kind::Ingress && d.object.ns_name() == name);
        // The references outside any Ingress stay apart (the base); each Ingress's are in its
        // footprint, and the plan's are their union.
        let mine = std::mem::replace(references, open.saved);
        let print = Footprint {
            origin: open.origin,
            hosts: open.hosts.into_iter().collect(),
            services: mine.services.iter().cloned().collect(),
            secrets: mine.secrets.iter().cloned().collect(),
            referenced: mine.ingresses.contains(&name),
            default_backend: open.default_backend,
            global: open.global || !own,
        };
        self.done.insert(name, print);
    }

    /// Takes what a recorder of other Ingresses recorded (a route phase split by host).
    pub(crate) fn absorb(&mut self, other: Recorder) {
        for (name, hosts) in other.late {
            self.late.entry(name).or_default().extend(hosts);
        }
        for (name, print) in other.done {
            self.done.entry(name).or_insert(print);
        }
    }

    /// The footprints, with `base`, the references made outside any Ingress.
    pub(crate) fn finish(mut self, base: References) -> Footprints {
        for (name, hosts) in self.late {
            if let Some(print) = self.done.get_mut(&name) {
                let mut all: BTreeSet<HostKey> = print.hosts.iter().cloned().collect();
                all.extend(hosts);
                print.hosts = all.into_iter().collect();
            }
        }
        let by_ingress = self
            .done
            .into_iter()
            .map(|(k, v)| (k, Arc::new(v)))
            .collect();
        Footprints { by_ingress, base }
    }
}

/// At most this share of our Ingresses (in 1/8) are run again before the full route phase is the
/// cheaper way.
const MAX_SHARE_EIGHTHS: usize = 2;

/// How many times the set of hosts may grow before giving up.
const MAX_ROUNDS: usize = 8;

/// The Ingresses to plan again ([`plan_ingress_change`]) after a change of the Ingresses
/// `ingresses` and of the Services `services` and Secrets `secrets` the routes read: those
/// Ingresses and every Ingress of `previous` that read a changed Service or Secret (its
/// footprint names it). `None` when the full route phase must run: something outside any
/// Ingress reads one of them (the `--default-tls-secret`, a Gateway API route), or no Ingress
/// does (the references and the footprints disagree).
pub fn changed_ingresses(
    previous: &RoutePlan,
    ingresses: &BTreeSet<NsName>,
    services: &BTreeSet<NsName>,
    secrets: &BTreeSet<NsName>,
) -> Option<BTreeSet<NsName>> {
    if services.is_empty() && secrets.is_empty() {
        return Some(ingresses.clone());
    }
    let prints = &previous.footprints;
    let base = &prints.base;
    if services.iter().any(|s| base.services.contains(s))
        || secrets.iter().any(|s| base.secrets.contains(s))
    {
        return None;
    }
    let mut changed = ingresses.clone();
    let mut readers = 0;
    for (name, print) in &prints.by_ingress {
        if print.services.iter().any(|s| services.contains(s))
            || print.secrets.iter().any(|s| secrets.contains(s))
        {
            changed.insert(name.clone());
            readers += 1;
        }
    }
    (readers > 0).then_some(changed)
}

/// The route plan after a change of only the Ingresses `changed` (any of which may now be gone
/// or not ours), from `previous`, the plan of the inputs before the change; `None` when the full
/// route phase must run (see the module documentation).
pub fn plan_ingress_change(
    previous: &RoutePlan,
    inputs: &mut Inputs<'_>,
    config: &Config,
    changed: &BTreeSet<NsName>,
) -> Option<RoutePlan> {
    let prints = &previous.footprints;
    let old = prints
        .by_ingress
        .iter()
        .filter(|(k, _)| changed.contains(*k));
    let mut hosts: BTreeSet<HostKey> = BTreeSet::new();
    // Whether the default backend is to be settled again (every Ingress with one run again).
    let mut defaults = false;
    for (_, print) in old {
        if print.global {
            return None;
        }
        defaults |= print.default_backend;
        hosts.extend(print.hosts.iter().cloned());
    }
    let sorted = inputs.sorted;
    debug_assert!(!sorted || inputs.ingresses.is_sorted_by(|a, b| key(a) < key(b)));
    let limit = (prints.by_ingress.len() * MAX_SHARE_EIGHTHS / 8).max(8);
    let mut partial_config = config.clone();
    partial_config.default_tls_secret = None;
    for _ in 0..MAX_ROUNDS {
        let mut members: BTreeSet<NsName> = changed.clone();
        members.extend(
            prints
                .by_ingress
                .iter()
                .filter(|(_, p)| {
                    (defaults && p.default_backend) || p.hosts.iter().any(|h| hosts.contains(h))
                })
                .map(|(k, _)| k.clone()),
        );
        if members.len() > limit {
            return None;
        }
        let ingresses = member_ingresses(&inputs.ingresses, &members, sorted);
        // The inputs with the members for Ingresses and no Gateway API objects, lent (copying
        // every other object's pointer took a tenth of a by-host publish).
        let all = std::mem::replace(&mut inputs.ingresses, ingresses);
        let gateway_api = std::mem::take(&mut inputs.gateway_api);
        let partial = super::plan_routes(inputs, &partial_config);
        inputs.ingresses = all;
        inputs.gateway_api = gateway_api;
        let new_prints = &partial.footprints.by_ingress;
        if new_prints.values().any(|p| p.global) {
            return None;
        }
        let touched: BTreeSet<HostKey> = new_prints
            .values()
            .flat_map(|p| p.hosts.iter().cloned())
            .collect();
        let new_defaults = new_prints.values().any(|p| p.default_backend);
        if touched.is_subset(&hosts) && (defaults || !new_defaults) {
            return Some(merge(previous, partial, &members, &hosts, defaults));
        }
        hosts.extend(touched);
        defaults |= new_defaults;
    }
    None
}

fn key(i: &StoredIngress) -> (&str, &str) {
    let namespace = i.metadata.namespace.as_deref().unwrap_or("default");
    (namespace, i.metadata.name.as_deref().unwrap_or_default())
}

/// The Ingresses of `all` named in `members`, in name order. They are found with borrowed
/// names, not through a map of every Ingress by an allocated name: by binary search when `all`
/// is sorted (as the index lists them), else by one pass over it.
fn member_ingresses<'a>(
    all: &[&'a StoredIngress],
    members: &BTreeSet<NsName>,
    sorted: bool,
) -> Vec<&'a StoredIngress> {
    if sorted {
        let find = |m: &NsName| {
            let wanted = (m.namespace.as_str(), m.name.as_str());
            all.binary_search_by(|i| key(i).cmp(&wanted)).ok()
        };
        return members.iter().filter_map(find).map(|at| all[at]).collect();
    }
    let wanted: BTreeSet<(&str, &str)> = members
        .iter()
        .map(|m| (m.namespace.as_str(), m.name.as_str()))
        .collect();
    let mut ingresses: Vec<&StoredIngress> = all
        .iter()
        .copied()
        .filter(|i| wanted.contains(&key(i)))
        .collect();
    ingresses.sort_by(|a, b| key(a).cmp(&key(b)));
    ingresses
}

/// The previous plan with the hosts `hosts` (their routes and certificates), the Ingresses
/// `members` and, with `defaults`, the default backend taken from `partial`.
fn merge(
    previous: &RoutePlan,
    partial: RoutePlan,
    members: &BTreeSet<NsName>,
    hosts: &BTreeSet<HostKey>,
    defaults: bool,
) -> RoutePlan {
    let table = replace_hosts(&previous.table, &partial.table, hosts, defaults);
    let certs = replace_certs(&previous.certs, &partial.certs, hosts);
    let mut by_ingress = previous.footprints.by_ingress.clone();
    by_ingress.retain(|k, _| !members.contains(k));
    by_ingress.extend(
        partial
            .footprints
            .by_ingress
            .iter()
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    let footprints = Footprints {
        by_ingress,
        base: previous.footprints.base.clone(),
    };
    let references = merge_references(previous, &partial, members, &footprints);
    let backends = merge_backends(previous, &partial, &table, hosts, defaults);
    let of_member =
        |d: &Diagnostic| d.object.kind == Kind::Ingress && members.contains(&d.object.ns_name());
    let mut diagnostics: Vec<Diagnostic> = previous
        .diagnostics
        .iter()
        .filter(|d| !of_member(d))
        .cloned()
        .chain(partial.diagnostics)
        .collect();
    diagnostics.sort();
    diagnostics.dedup();
    let mut annotations: Vec<_> = previous
        .annotations
        .iter()
        .filter(|r| !members.contains(&r.ingress))
        .cloned()
        .chain(partial.annotations)
        .collect();
    let age = |name: &NsName| {
        footprints.by_ingress.get(name).map(|p| {
            (
                p.origin.created,
                p.origin.namespace.clone(),
                p.origin.name.clone(),
            )
        })
    };
    annotations.sort_by_cached_key(|r| age(&r.ingress));
    RoutePlan {
        table,
        backends,
        references,
        diagnostics,
        certs,
        annotations,
        gateways: previous.gateways.clone(),
        gateway_report: previous.gateway_report.clone(),
        footprints: Arc::new(footprints),
    }
}

/// The backends of the merged plan made of `table`: every backend its routes and the Gateway API
/// tables use, its spec from the partial run or else the previous plan.
fn merge_backends(
    previous: &RoutePlan,
    partial: &RoutePlan,
    table: &RouteTable,
    hosts: &BTreeSet<HostKey>,
    defaults: bool,
) -> BTreeMap<BackendId, Arc<BackendSpec>> {
    // What the replaced hosts (and default backend) use, before and after.
    let before = ids_of_hosts(&previous.table, hosts, defaults);
    let after = ids_of_hosts(table, hosts, defaults);
    if before.iter().all(|id| after.contains(id)) {
        // No backend lost a route (a path added, a Service's port changed): the used backends
        // are the previous plan's and those the replaced hosts use now; a spec the partial run
        // made is the newer (a Service changed). The previous backends are shared specs: a copy
        // of pointers, where the walk below hashes every route's id of the whole table.
        let mut backends = previous.backends.clone();
        for (id, spec) in &partial.backends {
            if after.contains(id) || backends.contains_key(id) {
                backends.insert(id.clone(), spec.clone());
            }
        }
        return backends;
    }
    // Every backend the table and the Gateway API tables use, its spec from the partial run or
    // else the previous plan. Both plans' backends are sorted by id: walked together (the
    // partial's spec first), kept when used (hashed: sorting the 20,000 ids of the 10k-Ingress size
    // took a third of the merge), collected in order (a B-tree built from sorted input).
    let gateway_ids = previous
        .gateways
        .actions()
        .flat_map(RouteAction::backend_ids);
    let used: HashSet<&BackendId, foldhash::fast::RandomState> =
        table.backend_ids().chain(gateway_ids).collect();
    union_sorted(&partial.backends, &previous.backends)
        .filter(|(id, _)| used.contains(id))
        .map(|(id, spec)| (id.clone(), spec.clone()))
        .collect()
}

/// The references of the merged plan: the previous plan's (shared) when the `members` reference
/// what they referenced before (the common edit: a path, a port, an annotation), else those of
/// the merged `footprints` (20,000 names collected and sorted at the 10k-Ingress size).
fn merge_references(
    previous: &RoutePlan,
    partial: &RoutePlan,
    members: &BTreeSet<NsName>,
    footprints: &Footprints,
) -> Arc<References> {
    fn referenced<'p>(
        plan: &'p RoutePlan,
        name: &NsName,
    ) -> Option<(bool, &'p [NsName], &'p [NsName])> {
        let print = plan.footprints.by_ingress.get(name)?;
        Some((print.referenced, &print.services, &print.secrets))
    }
    let same = members
        .iter()
        .all(|name| referenced(previous, name) == referenced(partial, name));
    if same {
        previous.references.clone()
    } else {
        Arc::new(footprints.references())
    }
}

/// The backend ids the entries of `hosts` in `table` use, and its default backend's with
/// `defaults`.
fn ids_of_hosts<'t>(
    table: &'t RouteTable,
    hosts: &BTreeSet<HostKey>,
    defaults: bool,
) -> HashSet<&'t BackendId, foldhash::fast::RandomState> {
    let entries = hosts.iter().filter_map(|host| entry(table, host));
    let default = table.default_backend.as_ref().filter(|_| defaults);
    entries
        .flat_map(|entry| entry.rules.iter().map(|rule| &rule.action))
        .chain(default)
        .flat_map(RouteAction::backend_ids)
        .collect()
}

/// The entry of `host` in `table`.
fn entry<'t>(table: &'t RouteTable, host: &HostKey) -> Option<&'t HostRules> {
    match host {
        HostKey::Exact(name) => table.exact.get(name.as_str()),
        HostKey::Wildcard(suffix) => table.wildcard.get(suffix.as_str()),
        HostKey::Any => Some(&table.any_host),
    }
}

/// The entries of two maps in key order, each key once: `first`'s entry where both have it.
fn union_sorted<'a, K: Ord, V>(
    first: &'a BTreeMap<K, V>,
    second: &'a BTreeMap<K, V>,
) -> impl Iterator<Item = (&'a K, &'a V)> {
    let mut a = first.iter().peekable();
    let mut b = second.iter().peekable();
    std::iter::from_fn(move || match (a.peek(), b.peek()) {
        (Some((ka, _)), Some((kb, _))) => match ka.cmp(kb) {
            std::cmp::Ordering::Less => a.next(),
            std::cmp::Ordering::Greater => b.next(),
            std::cmp::Ordering::Equal => {
                b.next();
                a.next()
            }
        },
        (Some(_), None) => a.next(),
        (None, _) => b.next(),
    })
}

/// The certificates of `previous` with the entries of `hosts` as in `partial` (gone where
/// `partial` has none; the default certificate is `previous`'s); `previous` itself when none
/// differs.
fn replace_certs(
    previous: &Arc<CertTable>,
    partial: &CertTable,
    hosts: &BTreeSet<HostKey>,
) -> Arc<CertTable> {
    let written: Vec<_> = hosts
        .iter()
        .filter(|h| **h != HostKey::Any)
        .map(HostKey::display)
        .collect();
    if written.iter().all(|h| previous.host(h) == partial.host(h)) {
        return previous.clone();
    }
    let mut certs = (**previous).clone();
    for host in &written {
        if previous.host(host) != partial.host(host) {
            certs.set_host(host, partial.host(host).cloned());
        }
    }
    Arc::new(certs)
}

/// The previous table with the entries of `hosts` (and the default backend, with `defaults`)
/// from `partial`. An entry equal to the previous one stays the previous one (its rules shared:
/// the dataplane keeps what it derived from them), and when every one does the table is the
/// previous table itself: nothing else is compared (the other hosts are the previous entries).
fn replace_hosts(
    previous: &Arc<RouteTable>,
    partial: &RouteTable,
    hosts: &BTreeSet<HostKey>,
    defaults: bool,
) -> Arc<RouteTable> {
    let same = |new: Option<&HostRules>, old: Option<&HostRules>| match (new, old) {
        (Some(new), Some(old)) => super::reuse::same_rules(new, old),
        (new, old) => new.is_none() && old.is_none(),
    };
    let changed: Vec<&HostKey> = hosts
        .iter()
        .filter(|host| !same(entry(partial, host), entry(previous, host)))
        .collect();
    let default_changed = defaults && partial.default_backend != previous.default_backend;
    if changed.is_empty() && !default_changed {
        return previous.clone();
    }
    let mut table = RouteTable::clone(previous);
    for host in changed {
        match host {
            HostKey::Exact(name) => match partial.exact.get(name.as_str()) {
                Some(entry) => {
                    table.exact.insert(name.as_str().into(), entry.clone());
                }
                None => {
                    table.exact.remove(name.as_str());
                }
            },
            HostKey::Wildcard(suffix) => match partial.wildcard.get(suffix.as_str()) {
                Some(entry) => {
                    table.wildcard.insert(suffix.as_str().into(), entry.clone());
                }
                None => {
                    table.wildcard.remove(suffix.as_str());
                }
            },
            HostKey::Any => table.any_host = partial.any_host.clone(),
        }
    }
    if default_changed {
        table.default_backend = partial.default_backend.clone();
    }
    Arc::new(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn union_sorted_walks_both_maps_in_key_order_the_first_winning() {
        let first = BTreeMap::from([(2, "a2"), (3, "a3"), (7, "a7")]);
        let second = BTreeMap::from([(1, "b1"), (3, "b3"), (8, "b8"), (9, "b9")]);
        let union: Vec<_> = union_sorted(&first, &second)
            .map(|(k, v)| (*k, *v))
            .collect();
        assert_eq!(
            union,
            [
                (1, "b1"),
                (2, "a2"),
                (3, "a3"),
                (7, "a7"),
                (8, "b8"),
                (9, "b9")
            ]
        );
        let empty = BTreeMap::new();
        assert_eq!(union_sorted(&empty, &second).count(), 4);
        assert_eq!(union_sorted(&first, &empty).count(), 3);
    }
}
