//! The Ingress processor: our Ingresses, oldest first (creationTimestamp, then namespace/name),
//! into the [`Translation`], per the Ingress v1 spec.
//!
//! - A missing path is `/`; a missing `pathType` is `ImplementationSpecific` (treated as
//!   `Prefix`); a path not starting with `/` or an unknown `pathType` is skipped (`InvalidPath`);
//!   a host that is neither a DNS name nor a `*.` wildcard is skipped (`InvalidHost`).
//! - A backend whose Service or port (by number or name) does not exist is skipped with a
//!   diagnostic; the rest of the Ingress is served. `BackendId`s use the port as written.
//!   `resource` backends are not served (`UnsupportedBackend`).
//! - The default backend is the `defaultBackend` of the oldest Ingress whose `defaultBackend`
//!   resolves; later ones get `DuplicateDefaultBackend`.
//! - `duet.dev/upstream-family` sets the route's family policy per Ingress; an invalid value is an
//!   `InvalidAnnotation` diagnostic and the global policy applies.
//! - `duet.dev/proxy-body-size` sets the route's request body limit per Ingress; the upstream
//!   timeout annotations are read by `timeouts`, the upstream TLS ones by `upstream`, and the
//!   `nginx.ingress.kubernetes.io/` ones by `nginx` (a `duet.dev/` annotation wins over its
//!   ingress-nginx twin).
//! - `spec.tls` feeds the certificate table and the HTTPS redirect (see `certs`).
//! - ingress-nginx's access annotations (limits, basic and external auth) resolve to one access
//!   policy per Ingress, its basic-auth Secret among the references (`nginx::access`); its
//!   traffic annotations choose per path (`nginx::traffic`); `service-upstream` sends a backend
//!   to its Service's cluster IPs ([`Translation::cluster_ip_backend`]); the rules of a canary
//!   Ingress and the other spelling of a `from-to-www-redirect` host are held back and settled
//!   once every Ingress is read (`nginx::routing`).

use std::fmt;
use std::sync::Arc;

use dataplane::access_policy::Access;
use dataplane::table::{Redirect, SourceRanges, UpstreamTimeouts};
use dataplane::{BackendId, FamilyPolicy, Origin, OriginKind, PathMatch, PathRule, RouteAction};
use k8s_openapi::api::networking::v1::{HTTPIngressPath, IngressBackend, IngressRule};

use super::annotation::{annotation, Annotated};
use super::certs::TlsHosts;
use super::nginx::routing::Pending;
use super::routes::HostKey;
use super::translation::{FastMap, FastSet, PortRef, Translation};
use super::{nginx, timeouts, AnnotationReport, Config, Diagnostic, Inputs, Reason};
use crate::class::Classes;
use crate::object::{Kind, NsName, ObjectKey};
use crate::stored::{Annotations, StoredIngress};
use crate::units::{parse_body_size, MAX_BODY_SIZE};

/// The per-Ingress annotation overriding `--upstream-family`.
pub const UPSTREAM_FAMILY_ANNOTATION: &str = super::annotation::UPSTREAM_FAMILY.name;

/// The per-Ingress annotation overriding `--max-body-size` (`512`, `8k`, `10m`, `0` = unlimited).
pub const BODY_SIZE_ANNOTATION: &str = super::annotation::PROXY_BODY_SIZE.name;

/// Feeds our Ingresses into a translation.
pub(crate) struct IngressProcessor<'a> {
    /// Our Ingresses, oldest first, each with its position in the inputs.
    ours: Vec<(Origin, &'a StoredIngress, usize)>,
}

impl<'a> IngressProcessor<'a> {
    /// The processor of the Ingresses of `inputs` that are ours.
    pub(crate) fn new(inputs: &Inputs<'a>, config: &Config) -> IngressProcessor<'a> {
        let classes = Classes::new(inputs.ingress_classes.iter().copied());
        let mut ours: Vec<(Origin, &StoredIngress, usize)> = inputs
            .ingresses
            .iter()
            .enumerate()
            .filter(|(_, i)| config.class.is_ours(i, &classes))
            .map(|(position, i)| (origin(i), *i, position))
            .collect();
        ours.sort_by(|a, b| age_key(&a.0).cmp(&age_key(&b.0)));
        IngressProcessor { ours }
    }

    /// [`run`](Self::run) split over up to `parts` threads: the Ingresses fall into groups
    /// that share no host (the hosts of their rules, each exact host's `www.` twin, their
    /// `spec.tls` hosts; every Ingress with a `defaultBackend` in one group), each part's groups
    /// are run on a translation of their own and the parts are absorbed into `t`. Every host's
    /// entry, certificate and diagnostics come from the same Ingresses in the same order as on
    /// one thread, so the plan is the same ([`super::plan_routes_in_parts`]). On one thread when
    /// a part would hold fewer than `min_per_part` Ingresses, or a `spec.tls` host is no host
    /// key or two Ingresses have one name: all of them oldest first when there are fewer than
    /// two parts' worth, else (one core) grouped as below.
    ///
    /// A part runs its groups in the order of the inputs (the store's: by namespace and name),
    /// each group's Ingresses oldest first: groups share nothing, so their order does not change
    /// the plan, and in a cluster the oldest-first order of all Ingresses is the order they were
    /// created in, unrelated to their names. Run in that order, every map the route phase fills
    /// by name (the hosts, backends, references and footprints, whose keys mostly follow the
    /// Ingress's namespace and name) was filled at random places: at the 10k-Ingress size with
    /// creation times the route phase took 40 % longer than without.
    pub(crate) fn run_in_parts<'a2>(
        self,
        t: &mut Translation<'a2>,
        inputs: &Inputs<'a2>,
        config: &'a2 Config,
        parts: usize,
        min_per_part: usize,
    ) where
        'a: 'a2,
    {
        // Grouping pays for itself from two parts' worth of Ingresses, on one core too (for the
        // name order alone).
        let whole_parts = self.ours.len() / min_per_part.max(1);
        if whole_parts < 2 {
            return self.run(t);
        }
        let parts = parts.clamp(1, whole_parts);
        let odd = odd_services(inputs);
        let Some(assigned) = split(&self.ours, parts, &odd) else {
            return self.run(t);
        };
        let mut lists: Vec<Vec<(Origin, &StoredIngress, usize)>> = vec![Vec::new(); parts];
        let mut order: Vec<&StoredIngress> = Vec::with_capacity(self.ours.len());
        for ((origin, ingress, _), (part, group_at)) in self.ours.into_iter().zip(assigned) {
            order.push(ingress);
            // Oldest first within a group: a stable sort by the group's position keeps it.
            lists[part].push((origin, ingress, group_at));
        }
        for list in &mut lists {
            list.sort_by_key(|(_, _, group_at)| *group_at);
        }
        let mut lists = lists.into_iter();
        let first = lists.next().unwrap_or_default();
        let done: Vec<super::translation::Part> = std::thread::scope(|scope| {
            let others: Vec<_> = lists
                .map(|ours| {
                    scope.spawn(move || {
                        let mut part = Translation::new(inputs, config);
                        IngressProcessor { ours }.run(&mut part);
                        part.into_part()
                    })
                })
                .collect();
            IngressProcessor { ours: first }.run(t);
            others
                .into_iter()
                .map(|h| h.join().expect("a part of the route phase"))
                .collect()
        });
        // Each Ingress's position, oldest first: made only when there are annotation reports to
        // order (none at the 10k-Ingress size, where this map cost 10,000 names).
        let positions: std::cell::OnceCell<FastMap<(&str, &str), usize>> = Default::default();
        let age = |name: &NsName| {
            let positions = positions.get_or_init(|| {
                let key = |i: &'a2 StoredIngress| (namespace_of(i), i.metadata.name.as_deref());
                let keys = order.iter().map(|i| key(i));
                keys.enumerate()
                    .map(|(position, (ns, name))| ((ns, name.unwrap_or_default()), position))
                    .collect()
            });
            let key = (name.namespace.as_str(), name.name.as_str());
            positions.get(&key).copied().unwrap_or(usize::MAX)
        };
        for part in done {
            t.absorb(part);
        }
        // The annotation reports as one thread makes them: by Ingress, oldest first (a stable
        // sort keeps each Ingress's own order).
        if !t.annotations.is_empty() {
            t.annotations.sort_by_cached_key(|r| age(&r.ingress));
        }
    }

    /// Adds every Ingress, oldest first, then the rules held back for canaries and
    /// `from-to-www-redirect`.
    pub(crate) fn run(self, t: &mut Translation<'_>) {
        let mut held = Pending::default();
        for (origin, ingress, _) in self.ours {
            t.begin_ingress(&origin, ingress);
            add_ingress(t, &mut held, origin, ingress);
            t.end_ingress();
        }
        settle(t, held);
    }
}

/// Which part each of `ours` (oldest first) goes to and the first position in the inputs of its
/// group's Ingresses, or `None` when the route phase cannot be split (a `spec.tls` host that is
/// no host key, two Ingresses with one name). Ingresses sharing a host (see
/// [`IngressProcessor::run_in_parts`]) are in one group; groups go whole to the part with the
/// fewest paths so far, in order of their oldest Ingress.
///
/// What Ingresses share is keyed by a 64-bit digest of it ([`Shared`]), made without copying a
/// host or its `www.` twin: two different things with one digest only put their Ingresses in
/// one group, which changes how the work is split, never the plan.
fn split(
    ours: &[(Origin, &StoredIngress, usize)],
    parts: usize,
    odd: &std::collections::HashSet<(&str, &str)>,
) -> Option<Vec<(usize, usize)>> {
    let mut groups = Groups::new(ours.len());
    let mut first: FastMap<u64, usize> =
        FastMap::with_capacity_and_hasher(ours.len() * 3, Default::default());
    let mut names: FastSet<(&str, &str)> =
        FastSet::with_capacity_and_hasher(ours.len(), Default::default());
    let mut weight = vec![1usize; ours.len()];
    let mut link = |groups: &mut Groups, key: Shared, i: usize| match first.entry(key.0) {
        std::collections::hash_map::Entry::Occupied(o) => groups.join(*o.get(), i),
        std::collections::hash_map::Entry::Vacant(v) => {
            v.insert(i);
        }
    };
    for (i, (origin, ingress, _)) in ours.iter().enumerate() {
        if !names.insert((&origin.namespace, &origin.name)) {
            return None;
        }
        let Some(spec) = ingress.spec.as_ref() else {
            continue;
        };
        if spec.default_backend.is_some() {
            link(&mut groups, Shared::default_backend(), i);
        }
        let namespace = &*origin.namespace;
        let backends = spec
            .default_backend
            .iter()
            .chain(spec.rules.iter().flatten().flat_map(|r| {
                r.http
                    .iter()
                    .flat_map(|h| h.paths.iter().map(|p| &p.backend))
            }));
        for service in backends.filter_map(|b| b.service.as_ref()) {
            if let Some(&(ns, name)) = odd.get(&(namespace, service.name.as_str())) {
                link(&mut groups, Shared::service(ns, name), i);
            }
        }
        for rule in spec.rules.iter().flatten() {
            weight[i] += rule.http.as_ref().map_or(0, |h| h.paths.len());
            // An invalid host is a diagnostic of this Ingress only.
            let Ok(host) = HostKey::parse(rule.host.as_deref()) else {
                continue;
            };
            if let HostKey::Exact(name) = &host {
                if let Some(twin) = Shared::www_twin(name) {
                    link(&mut groups, twin, i);
                }
            }
            link(&mut groups, Shared::host(&host), i);
        }
        let tls = spec.tls.iter().flatten();
        for host in tls.flat_map(|t| t.hosts.iter().flatten()) {
            match HostKey::parse(Some(host)) {
                Ok(HostKey::Any) => {}
                Ok(key) => link(&mut groups, Shared::host(&key), i),
                Err(_) => return None,
            }
        }
    }
    Some(assign_parts(ours, &mut groups, &weight, parts))
}

/// Each group's weight at its root (the index of its oldest Ingress), then each group, in the
/// order of its oldest Ingress, to the least loaded of `parts`: per Ingress, its part and the
/// position of its group's oldest Ingress.
fn assign_parts(
    ours: &[(Origin, &StoredIngress, usize)],
    groups: &mut Groups,
    weight: &[usize],
    parts: usize,
) -> Vec<(usize, usize)> {
    let roots: Vec<usize> = (0..ours.len()).map(|i| groups.root(i)).collect();
    let mut group_weight = vec![0usize; ours.len()];
    let mut group_at = vec![usize::MAX; ours.len()];
    for (i, root) in roots.iter().enumerate() {
        group_weight[*root] += weight[i];
        group_at[*root] = group_at[*root].min(ours[i].2);
    }
    let mut part_of_group = vec![usize::MAX; ours.len()];
    let mut load = vec![0usize; parts];
    roots
        .iter()
        .map(|&root| {
            if part_of_group[root] == usize::MAX {
                let (part, _) = load
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, l)| **l)
                    .expect("at least one part");
                load[part] += group_weight[root];
                part_of_group[root] = part;
            }
            (part_of_group[root], group_at[root])
        })
        .collect()
}

/// What two Ingresses can share that keeps them in one group, as a digest (FNV-1a over a tag and
/// the bytes: the same for a `www.` twin whether it is written out or not).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Shared(u64);

impl Shared {
    const START: u64 = 0xcbf2_9ce4_8422_2325;

    fn digest(mut hash: u64, bytes: &[u8]) -> u64 {
        for &b in bytes {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        hash
    }

    fn tagged(tag: u8, parts: &[&[u8]]) -> Shared {
        Shared(
            parts
                .iter()
                .fold(Self::digest(Self::START, &[tag]), |h, p| Self::digest(h, p)),
        )
    }

    /// A host key.
    fn host(host: &HostKey) -> Shared {
        match host {
            HostKey::Exact(name) => Self::tagged(b'E', &[name.as_bytes()]),
            HostKey::Wildcard(suffix) => Self::tagged(b'W', &[suffix.as_bytes()]),
            HostKey::Any => Self::tagged(b'A', &[]),
        }
    }

    /// The exact host [`nginx::traffic::www_twin`] gives for `name`, if any.
    fn www_twin(name: &str) -> Option<Shared> {
        let (prefix, rest) = nginx::traffic::www_twin_parts(name)?;
        Some(Self::tagged(b'E', &[prefix.as_bytes(), rest.as_bytes()]))
    }

    /// The table's default backend.
    fn default_backend() -> Shared {
        Self::tagged(b'D', &[])
    }

    /// A Service (namespace, name).
    fn service(namespace: &str, name: &str) -> Shared {
        Self::tagged(b'S', &[namespace.as_bytes(), b"/", name.as_bytes()])
    }
}

/// The Services (namespace, name) with a port whose `appProtocol` duet does not know: the first
/// route to such a port in a translation reports it (a diagnostic of the Service, which marks
/// that Ingress's footprint as reaching beyond its hosts), so the Ingresses routing to one are
/// kept in one group, in their order.
fn odd_services<'i>(inputs: &Inputs<'i>) -> std::collections::HashSet<(&'i str, &'i str)> {
    inputs
        .all_services()
        .into_iter()
        .filter(|s| {
            s.ports()
                .iter()
                .any(|p| super::app_protocol(p.app_protocol.as_deref()).is_none())
        })
        .map(|s| {
            (
                s.namespace().unwrap_or("default"),
                s.name().unwrap_or_default(),
            )
        })
        .collect()
}

/// Union-find over Ingress positions.
struct Groups {
    parent: Vec<usize>,
}

impl Groups {
    fn new(len: usize) -> Groups {
        Groups {
            parent: (0..len).collect(),
        }
    }

    fn root(&mut self, mut i: usize) -> usize {
        while self.parent[i] != i {
            self.parent[i] = self.parent[self.parent[i]];
            i = self.parent[i];
        }
        i
    }

    fn join(&mut self, a: usize, b: usize) {
        let (a, b) = (self.root(a), self.root(b));
        if a != b {
            // The older Ingress's root stays the root.
            let (keep, other) = if a < b { (a, b) } else { (b, a) };
            self.parent[other] = keep;
        }
    }
}

/// Attaches each canary to its main rules, then gives each `from-to-www-redirect` host's other
/// spelling, unless it has rules of its own, one rule answering 308 to the host.
fn settle(t: &mut Translation<'_>, held: Pending<HostKey>) {
    let (canaries, www) = held.into_parts();
    for canary in canaries {
        t.footprints.touch_late(canary.origin(), &canary.host);
        let scope = t.config.canary_scope;
        canary.attach(t.routes.rules_mut(&canary.host), scope, &mut t.diagnostics);
    }
    for (host, rule) in www {
        let HostKey::Exact(name) = &host else {
            continue;
        };
        let Some(other) = nginx::traffic::www_twin(name).map(HostKey::Exact) else {
            continue;
        };
        t.footprints.touch_late(&rule.action.origin, &other);
        if !t.routes.has_host(&other) {
            let rule = nginx::routing::www_rule(&rule, &host.display());
            t.routes.add(&other, rule, "/", false);
        }
    }
}

/// An Ingress's namespace (`default` when unset).
fn namespace_of(ingress: &StoredIngress) -> &str {
    ingress.metadata.namespace.as_deref().unwrap_or("default")
}

/// The origin of an Ingress: namespace, name and creation time in Unix seconds (0 when unset).
fn origin(ingress: &StoredIngress) -> Origin {
    Origin {
        kind: OriginKind::Ingress,
        namespace: namespace_of(ingress).into(),
        name: ingress.metadata.name.as_deref().unwrap_or_default().into(),
        created: ingress
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(0, |t| t.0.as_second()),
    }
}

fn age_key(o: &Origin) -> (i64, &str, &str) {
    (o.created, &o.namespace, &o.name)
}

/// What one Ingress sets for all of its routes.
struct IngressRoutes<'i> {
    key: ObjectKey,
    ingress: &'i StoredIngress,
    origin: Arc<Origin>,
    policy: FamilyPolicy,
    max_body_bytes: u64,
    timeouts: UpstreamTimeouts,
    redirect: Option<Arc<Redirect>>,
    source_ranges: Option<Arc<SourceRanges>>,
    access: Option<Arc<Access>>,
    client_auth: Option<Arc<dataplane::client_auth::ClientAuth>>,
    nginx: nginx::Settings,
    tls: TlsHosts,
}

impl IngressRoutes<'_> {
    /// The backend of a route of this Ingress, resolved (for messages, `what` the route is);
    /// with `service-upstream`, the Service's cluster IPs instead of its pods. Not on a canary
    /// Ingress, whose `service-upstream` is reported ignored (the main Ingress's keys apply).
    fn backend(
        &self,
        t: &mut Translation<'_>,
        backend: &IngressBackend,
        what: &dyn fmt::Display,
    ) -> Option<BackendId> {
        let id = resolve(t, &self.key, backend, what)?;
        let traffic = &self.nginx.traffic;
        Some(if traffic.service_upstream && !traffic.canary {
            t.cluster_ip_backend(&self.key, id)
        } else {
            id
        })
    }

    /// The action of a route of this Ingress to `backend` on `host` (`""`: host-less) for the
    /// path as written (`None`: the default backend), resolved.
    fn action(
        &self,
        t: &mut Translation<'_>,
        backend: BackendId,
        host: &str,
        path: Option<&str>,
    ) -> RouteAction {
        let protocol = self.nginx.backend_protocol;
        let upstream_tls = t.upstream_tls(&self.key, self.ingress, &backend, protocol);
        RouteAction {
            backend,
            policy: self.policy,
            origin: self.origin.clone(),
            redirect_https: self.nginx.redirects(self.tls.redirects(host)),
            max_body_bytes: self.max_body_bytes,
            upstream_tls,
            timeouts: self.timeouts.into(),
            protocol,
            redirect: self.redirect.clone(),
            source_ranges: self.source_ranges.clone(),
            rewrite: path.and_then(|p| self.nginx.rewrite_for(p)),
            access: self.access.clone(),
            choice: self.nginx.traffic.choice(path.unwrap_or("/")).map(Arc::new),
            filters: None,
            client_auth: self.client_auth.clone(),
        }
    }
}

/// Adds one Ingress: its settings, certificates, default backend and rules.
fn add_ingress(
    t: &mut Translation<'_>,
    held: &mut Pending<HostKey>,
    origin: Origin,
    ingress: &StoredIngress,
) {
    let key = ObjectKey::new(Kind::Ingress, &*origin.namespace, &*origin.name);
    let Some(nginx) = nginx_compat(
        &key,
        ingress,
        t.config,
        &mut t.diagnostics,
        &mut t.annotations,
    ) else {
        return;
    };
    t.references
        .ingresses
        .insert(NsName::new(&*origin.namespace, &*origin.name));
    let Some(routes) = settings(t, key, origin, ingress, nginx) else {
        return;
    };
    let Some(spec) = ingress.spec.as_ref() else {
        return;
    };
    if let Some(backend) = spec.default_backend.as_ref() {
        default_backend(t, &routes, backend);
    }
    for rule in spec.rules.iter().flatten() {
        add_rule(t, held, &routes, rule);
    }
}

/// What an Ingress sets for its routes, its `spec.tls` taken into the certificates; `None` for
/// an Ingress without a spec (after its annotations are read, so their problems are reported).
fn settings<'i>(
    t: &mut Translation<'_>,
    key: ObjectKey,
    origin: Origin,
    ingress: &'i StoredIngress,
    nginx: nginx::Settings,
) -> Option<IngressRoutes<'i>> {
    let obj = Annotated::ingress(&key, ingress);
    let global = t.config.family_policy;
    let policy = annotation(
        &obj,
        UPSTREAM_FAMILY_ANNOTATION,
        |v| v.trim().parse::<FamilyPolicy>().map_err(|e| e.to_string()),
        (global, format_args!("using {global:?}")),
        &mut t.diagnostics,
    );
    let global = t.config.max_body_bytes;
    let max_body_bytes = annotation(
        &obj,
        BODY_SIZE_ANNOTATION,
        |v| {
            parse_body_size(v).map_err(|_| {
                format!(
                    "{v:?} is not a size like 512, 8k or 10m of at most {}g",
                    MAX_BODY_SIZE >> 30
                )
            })
        },
        (global, format_args!("using {global} bytes")),
        &mut t.diagnostics,
    );
    // `nginx` leaves a setting unset when the `duet.dev/` annotation for it is present.
    let max_body_bytes = nginx.body_size.unwrap_or(max_body_bytes);
    let mut timeouts = timeouts::upstream_timeouts(&obj, &mut t.diagnostics);
    timeouts.connect = timeouts.connect.or(nginx.connect_timeout);
    timeouts.read = timeouts.read.or(nginx.read_timeout);
    timeouts.send = nginx.traffic.send_timeout;
    let access = nginx::access::resolve(
        &nginx,
        &obj,
        &t.secrets,
        &t.config.auth_destinations,
        &mut t.diagnostics,
        &mut t.references,
    );
    let client_auth = nginx::client_tls::resolve(
        &nginx.client_tls,
        &key,
        &t.secrets,
        &mut t.diagnostics,
        &mut t.references,
    );
    ingress.spec.as_ref()?;
    let tls = t
        .certs
        .ingress(&key, ingress, &mut t.diagnostics, &mut t.references);
    Some(IngressRoutes {
        key,
        ingress,
        origin: Arc::new(origin),
        policy,
        max_body_bytes,
        timeouts,
        redirect: nginx.redirect(),
        source_ranges: nginx.source_ranges(),
        access,
        client_auth,
        nginx,
        tls,
    })
}

/// The Ingress's `defaultBackend`: the table's default backend unless an older Ingress's is.
fn default_backend(t: &mut Translation<'_>, routes: &IngressRoutes<'_>, backend: &IngressBackend) {
    let Some(id) = routes.backend(t, backend, &"default backend") else {
        return;
    };
    if let Some(winner) = t.routes.default_holder() {
        let message = format!(
            "the older Ingress {winner} already sets the default backend; this one is ignored"
        );
        t.diagnose(&routes.key, Reason::DuplicateDefaultBackend, message);
        return;
    }
    let action = routes.action(t, id, "", None);
    t.routes.set_default(action);
}

/// One rule of the Ingress: each of its paths on its host.
fn add_rule(
    t: &mut Translation<'_>,
    held: &mut Pending<HostKey>,
    routes: &IngressRoutes<'_>,
    rule: &IngressRule,
) {
    let host = match HostKey::parse(rule.host.as_deref()) {
        Ok(host) => host,
        Err(message) => {
            t.diagnose(&routes.key, Reason::InvalidHost, message);
            return;
        }
    };
    t.footprints.touch(&host);
    if routes.nginx.ssl_passthrough {
        t.footprints.global();
        passthrough_host(t, routes, &host);
    }
    for path in rule.http.iter().flat_map(|h| &h.paths) {
        add_path(t, held, routes, &host, path);
    }
}

/// An `ssl-passthrough` Ingress's host: relayed by TLS server name, which names exact hosts only
/// (ingress-nginx's TLS proxy compares whole names too).
fn passthrough_host(t: &mut Translation<'_>, routes: &IngressRoutes<'_>, host: &HostKey) {
    match host {
        HostKey::Exact(name) => t.routes.passthrough(name, &routes.origin),
        other => {
            let message = format!(
                "nginx.ingress.kubernetes.io/ssl-passthrough: {} is not an exact host (a TLS server name is matched whole); its HTTPS connections are terminated by duet",
                other.describe()
            );
            t.diagnose(&routes.key, Reason::IgnoredAnnotation, message);
        }
    }
}

/// One path of a rule on `host`: skipped with a diagnostic when the path or its backend is bad,
/// held back when it is a canary's.
fn add_path(
    t: &mut Translation<'_>,
    held: &mut Pending<HostKey>,
    routes: &IngressRoutes<'_>,
    host: &HostKey,
    path: &HTTPIngressPath,
) {
    let written = path
        .path
        .as_deref()
        .filter(|p| !p.is_empty())
        .unwrap_or("/");
    let Some(matcher) = path_match(t, &routes.key, written, &path.path_type) else {
        return;
    };
    let what = PathOnHost(written, host);
    let Some(id) = routes.backend(t, &path.backend, &what) else {
        return;
    };
    let own_regex = routes.nginx.forces_regex(written);
    let pattern = nginx::regex_pattern(written, &path.path_type, own_regex);
    let action = routes.action(t, id, &host.display(), Some(written));
    let rule = PathRule::new(matcher, action);
    if held.defer(&routes.nginx.traffic, host, &rule, written) {
        if own_regex {
            t.routes.use_regex(host);
        }
        return;
    }
    t.routes.add(host, rule, pattern, own_regex);
}

/// `path <written> on <host>`, for messages about a path's backend: written only when a message
/// is made.
struct PathOnHost<'p>(&'p str, &'p HostKey);

impl fmt::Display for PathOnHost<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "path {} on {}", self.0, self.1.described())
    }
}

/// The match of a path as written with its `pathType`; a diagnostic and `None` when either is
/// invalid.
fn path_match(
    t: &mut Translation<'_>,
    key: &ObjectKey,
    written: &str,
    path_type: &str,
) -> Option<PathMatch> {
    if !written.starts_with('/') {
        let message = format!("path {written:?} does not start with \"/\"; skipped");
        t.diagnose(key, Reason::InvalidPath, message);
        return None;
    }
    Some(match path_type {
        "Exact" => PathMatch::exact(written),
        "Prefix" => PathMatch::prefix(written),
        "ImplementationSpecific" | "" => PathMatch::implementation_specific(written),
        other => {
            let message = format!(
                "pathType {other:?} of path {written} is not Exact, Prefix or ImplementationSpecific; skipped"
            );
            t.diagnose(key, Reason::InvalidPath, message);
            return None;
        }
    })
}

/// Resolves an Ingress backend to a Service port; a diagnostic and `None` when it cannot.
fn resolve(
    t: &mut Translation<'_>,
    key: &ObjectKey,
    backend: &IngressBackend,
    what: &dyn fmt::Display,
) -> Option<BackendId> {
    let Some(svc) = backend.service.as_ref() else {
        let message = format!("{what}: resource backends are not supported; skipped");
        t.diagnose(key, Reason::UnsupportedBackend, message);
        return None;
    };
    let name = NsName::new(key.namespace.clone(), svc.name.clone());
    let wanted = svc.port.as_ref();
    let port = match (
        wanted.and_then(|p| p.number),
        wanted.and_then(|p| p.name.as_deref()),
    ) {
        (Some(number), _) => PortRef::Number(number),
        (None, Some(port_name)) => PortRef::Name(port_name),
        (None, None) => PortRef::Missing,
    };
    t.service_port(key, name, port, what)
}

/// Reads an Ingress's ingress-nginx annotations: records its report and diagnostics, and returns
/// the settings to apply; `None` when `--strict-annotations` refuses the Ingress for a snippet.
fn nginx_compat(
    key: &ObjectKey,
    ingress: &StoredIngress,
    config: &Config,
    diagnostics: &mut Vec<Diagnostic>,
    reports: &mut Vec<AnnotationReport>,
) -> Option<nginx::Settings> {
    let annotations = ingress.metadata.annotations.as_ref();
    let mut read = nginx::read(annotations.map_or(&Annotations::default(), |a| a));
    nginx::passthrough::settle(&mut read, config.ssl_passthrough);
    diagnostics.extend(nginx::diagnostics(key, &read.findings));
    if !read.findings.is_empty() {
        reports.push(AnnotationReport {
            ingress: NsName::new(key.namespace.clone(), key.name.clone()),
            annotations: read.findings,
        });
    }
    if config.strict_annotations && !read.settings.snippets.is_empty() {
        diagnostics.push(Diagnostic::new(
            key.clone(),
            Reason::SnippetAnnotation,
            format!(
                "refused whole (--strict-annotations): it carries {}; none of its routes are served",
                read.settings.snippets.join(", ")
            ),
        ));
        return None;
    }
    Some(read.settings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The digest of a host's `www.` twin is that of the twin written out, so Ingresses
        /// that share a host through the twin stay in one group.
        #[test]
        fn www_twin_digest_is_the_written_twins(name in "(\\*\\.|www\\.)?([a-z0-9-]{0,6}\\.){0,3}[a-z0-9-]{0,6}") {
            let written = nginx::traffic::www_twin(&name).map(|twin| Shared::host(&HostKey::Exact(twin)));
            prop_assert_eq!(Shared::www_twin(&name), written);
        }
    }

    #[test]
    fn what_ingresses_share_has_distinct_digests() {
        let all = [
            Shared::host(&HostKey::Exact("a.example".into())),
            Shared::host(&HostKey::Wildcard("a.example".into())),
            Shared::host(&HostKey::Exact("www.a.example".into())),
            Shared::host(&HostKey::Any),
            Shared::default_backend(),
            Shared::service("a", "example"),
        ];
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }
}
