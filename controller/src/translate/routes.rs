//! The route phase: our Ingresses -> hosts, path rules and the default backend, per the Ingress v1
//! spec, plus the Service ports they use.
//!
//! - Hosts are lower-cased; `*.suffix` goes to the wildcard map under `suffix`; rules without a
//!   host apply to hosts without an entry of their own. Rules of one host are merged across
//!   Ingresses and sorted by precedence; an identical match of lower precedence is a
//!   `ConflictingPath` diagnostic.
//! - A missing path is `/`; a missing `pathType` is `ImplementationSpecific` (treated as
//!   `Prefix`); a path not starting with `/` or an unknown `pathType` is skipped (`InvalidPath`).
//! - A backend whose Service or port (by number or name) does not exist is skipped with a
//!   diagnostic; the rest of the Ingress is served. `BackendId`s use the port as written.
//! - The default backend is the `defaultBackend` of the oldest Ingress whose `defaultBackend`
//!   resolves (creationTimestamp, then namespace/name); later ones get `DuplicateDefaultBackend`.
//! - `duet.dev/upstream-family` sets the route's family policy per Ingress; an invalid value is an
//!   `InvalidAnnotation` diagnostic and the global policy applies.
//! - `duet.dev/proxy-body-size` sets the route's request body limit per Ingress; the upstream
//!   timeout annotations are read by `timeouts`.
//! - `spec.tls` feeds the certificate table and the HTTPS redirect (see `certs`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use dataplane::table::HostRules;
use dataplane::{BackendId, FamilyPolicy, Origin, PathMatch, PathRule, RouteAction, RouteTable};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::{Ingress, IngressBackend};

use super::certs::CertBuilder;
use super::upstream::{app_protocol, UpstreamTlsBuilder};
use super::{BackendSpec, Config, Diagnostic, Inputs, Reason, RoutePlan};
use crate::class::Classes;
use crate::index::{Kind, NsName, ObjectKey, References};

/// The per-Ingress annotation overriding `--upstream-family`.
pub const UPSTREAM_FAMILY_ANNOTATION: &str = "duet.dev/upstream-family";

/// The per-Ingress annotation overriding `--max-body-size` (`512`, `8k`, `10m`, `0` = unlimited).
pub const BODY_SIZE_ANNOTATION: &str = "duet.dev/proxy-body-size";

/// Where a rule's host puts it in the table.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum HostKey {
    /// An exact host, lower case.
    Exact(String),
    /// A `*.` wildcard, by the suffix after `*.`, lower case.
    Wildcard(String),
    /// No host.
    Any,
}

impl HostKey {
    fn parse(host: Option<&str>) -> Result<HostKey, String> {
        let host = host.unwrap_or_default().trim();
        if host.is_empty() {
            return Ok(HostKey::Any);
        }
        let lower = host.to_ascii_lowercase();
        let lower = lower.strip_suffix('.').unwrap_or(&lower);
        let (wild, name) = match lower.strip_prefix("*.") {
            Some(suffix) => (true, suffix),
            None => (false, lower),
        };
        let valid = !name.is_empty()
            && name.split('.').all(|label| {
                !label.is_empty()
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            });
        if !valid {
            return Err(format!(
                "host {host:?} is neither a DNS name nor a \"*.\" wildcard; rule skipped"
            ));
        }
        Ok(if wild {
            HostKey::Wildcard(name.to_owned())
        } else {
            HostKey::Exact(name.to_owned())
        })
    }

    fn display(&self) -> String {
        match self {
            HostKey::Exact(h) => h.clone(),
            HostKey::Wildcard(s) => format!("*.{s}"),
            HostKey::Any => String::new(),
        }
    }

    fn describe(&self) -> String {
        match self {
            HostKey::Any => "any host".to_owned(),
            other => format!("host {}", other.display()),
        }
    }
}

/// The origin of an Ingress: namespace, name and creation time in Unix seconds (0 when unset).
pub(crate) fn origin(ingress: &Ingress) -> Origin {
    Origin {
        namespace: ingress
            .metadata
            .namespace
            .as_deref()
            .unwrap_or("default")
            .into(),
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

/// The route phase: builds the route table from our Ingresses. Never fails; every skipped part
/// becomes a diagnostic.
pub fn plan_routes(inputs: &Inputs<'_>, config: &Config) -> RoutePlan {
    let classes = Classes::new(inputs.ingress_classes.iter().copied());
    let services: BTreeMap<NsName, &Service> = inputs
        .services
        .iter()
        .map(|s| {
            let ns = s.metadata.namespace.as_deref().unwrap_or("default");
            (
                NsName::new(ns, s.metadata.name.clone().unwrap_or_default()),
                *s,
            )
        })
        .collect();
    let mut certs = CertBuilder::new(&inputs.secrets);
    let mut upstream_tls = UpstreamTlsBuilder::new(&inputs.secrets);
    let mut ours: Vec<(Origin, &Ingress)> = inputs
        .ingresses
        .iter()
        .filter(|i| config.class.is_ours(i, &classes))
        .map(|i| (origin(i), *i))
        .collect();
    ours.sort_by(|a, b| age_key(&a.0).cmp(&age_key(&b.0)));

    let mut b = Builder {
        services: &services,
        diagnostics: Vec::new(),
        references: References::default(),
        specs: BTreeMap::new(),
    };
    // Each rule with the regex it becomes if its host turns to regexes.
    let mut hosts: BTreeMap<HostKey, Vec<(PathRule, String)>> = BTreeMap::new();
    let mut regex_hosts: BTreeSet<HostKey> = BTreeSet::new();
    let mut default_backend: Option<RouteAction> = None;

    let mut annotation_reports = Vec::new();
    for (origin, ingress) in &ours {
        let key = ObjectKey::new(Kind::Ingress, &*origin.namespace, &*origin.name);
        let Some(nginx) = super::nginx_compat(
            &key,
            ingress,
            config,
            &mut b.diagnostics,
            &mut annotation_reports,
        ) else {
            continue;
        };
        b.references
            .ingresses
            .insert(NsName::new(&*origin.namespace, &*origin.name));
        let policy = b.policy(&key, ingress, config.family_policy);
        let max_body_bytes = b.body_size(&key, ingress, config.max_body_bytes);
        // `nginx` leaves a setting unset when the `duet.dev/` annotation for it is present.
        let max_body_bytes = nginx.body_size.unwrap_or(max_body_bytes);
        let mut timeouts = super::timeouts::upstream_timeouts(&key, ingress, &mut b.diagnostics);
        timeouts.connect = timeouts.connect.or(nginx.connect_timeout);
        timeouts.read = timeouts.read.or(nginx.read_timeout);
        let redirect = nginx.redirect();
        let source_ranges = nginx.source_ranges();
        let Some(spec) = ingress.spec.as_ref() else {
            continue;
        };

        let tls = certs.ingress(&key, ingress, &mut b.diagnostics, &mut b.references);

        if let Some(backend) = spec.default_backend.as_ref() {
            if let Some(id) = b.resolve(&key, backend, "default backend") {
                match &default_backend {
                    None => {
                        let upstream_tls = b.upstream_tls(&mut upstream_tls, &key, ingress, &id, nginx.backend_protocol);
                        default_backend = Some(RouteAction {
                            backend: id,
                            policy,
                            origin: origin.clone(),
                            redirect_https: nginx.redirects(tls.redirects("")),
                            max_body_bytes,
                            upstream_tls,
                            timeouts,
                            protocol: nginx.backend_protocol,
                            redirect: redirect.clone(),
                            source_ranges: source_ranges.clone(),
                            rewrite: None,
                        });
                    }
                    Some(winner) => b.diagnostics.push(Diagnostic::new(
                        key.clone(),
                        Reason::DuplicateDefaultBackend,
                        format!(
                            "the older Ingress {} already sets the default backend; this one is ignored",
                            winner.origin
                        ),
                    )),
                }
            }
        }

        for rule in spec.rules.iter().flatten() {
            let host = match HostKey::parse(rule.host.as_deref()) {
                Ok(host) => host,
                Err(message) => {
                    b.diagnostics
                        .push(Diagnostic::new(key.clone(), Reason::InvalidHost, message));
                    continue;
                }
            };
            for path in rule.http.iter().flat_map(|h| &h.paths) {
                let written = path
                    .path
                    .as_deref()
                    .filter(|p| !p.is_empty())
                    .unwrap_or("/");
                if !written.starts_with('/') {
                    b.diagnostics.push(Diagnostic::new(
                        key.clone(),
                        Reason::InvalidPath,
                        format!("path {written:?} does not start with \"/\"; skipped"),
                    ));
                    continue;
                }
                let matcher = match path.path_type.as_str() {
                    "Exact" => PathMatch::exact(written),
                    "Prefix" => PathMatch::prefix(written),
                    "ImplementationSpecific" | "" => PathMatch::implementation_specific(written),
                    other => {
                        b.diagnostics.push(Diagnostic::new(
                            key.clone(),
                            Reason::InvalidPath,
                            format!(
                                "pathType {other:?} of path {written} is not Exact, Prefix or ImplementationSpecific; skipped"
                            ),
                        ));
                        continue;
                    }
                };
                let what = format!("path {written} on {}", host.describe());
                let Some(id) = b.resolve(&key, &path.backend, &what) else {
                    continue;
                };
                let upstream_tls = b.upstream_tls(
                    &mut upstream_tls,
                    &key,
                    ingress,
                    &id,
                    nginx.backend_protocol,
                );
                let own_regex = nginx.forces_regex(written);
                if own_regex {
                    regex_hosts.insert(host.clone());
                }
                let pattern = super::nginx::regex_pattern(written, &path.path_type, own_regex);
                let rule = PathRule {
                    matcher,
                    action: RouteAction {
                        backend: id,
                        policy,
                        origin: origin.clone(),
                        redirect_https: nginx.redirects(tls.redirects(&host.display())),
                        max_body_bytes,
                        upstream_tls,
                        timeouts,
                        protocol: nginx.backend_protocol,
                        redirect: redirect.clone(),
                        source_ranges: source_ranges.clone(),
                        rewrite: nginx.rewrite_for(written),
                    },
                };
                hosts
                    .entry(host.clone())
                    .or_default()
                    .push((rule, pattern.to_owned()));
            }
        }
    }

    if let Some(name) = &config.default_tls_secret {
        certs.default_secret(name, &mut b.diagnostics, &mut b.references);
    }

    let mut table = RouteTable {
        default_backend,
        ..RouteTable::default()
    };
    for (host, rules) in hosts {
        let mut rules = if regex_hosts.contains(&host) {
            regex_rules(&host, rules, &mut b.diagnostics, &mut annotation_reports)
        } else {
            rules.into_iter().map(|(rule, _)| rule).collect()
        };
        // Rules of equal precedence that cannot match the same request (same length, different
        // paths) would otherwise keep input order: order them by path so the table is the same
        // whatever the input order. The sort is stable, so of two rules with the same match in
        // one Ingress the first written still wins.
        rules.sort_by(|a, b| tie_key(a).cmp(&tie_key(b)));
        let (entry, conflicts) = HostRules::new(&host.display(), rules);
        for lost in conflicts {
            let winner = entry.rules.iter().find(|k| k.same_match(&lost));
            let by = match winner {
                Some(w) if w.action.origin == lost.action.origin => {
                    "an earlier rule of the same Ingress".to_owned()
                }
                Some(w) => format!("Ingress {}", w.action.origin),
                None => "another rule".to_owned(),
            };
            b.diagnostics.push(Diagnostic::new(
                ObjectKey::new(
                    Kind::Ingress,
                    &*lost.action.origin.namespace,
                    &*lost.action.origin.name,
                ),
                Reason::ConflictingPath,
                format!(
                    "{} path {} on {} is already routed by {by}; this rule is ignored",
                    match_kind(&lost.matcher),
                    lost.matcher.path(),
                    host.describe(),
                ),
            ));
        }
        match host {
            HostKey::Exact(h) => {
                table.exact.insert(h.into(), entry);
            }
            HostKey::Wildcard(s) => {
                table.wildcard.insert(s.into(), entry);
            }
            HostKey::Any => table.any_host = entry,
        }
    }

    let used: BTreeSet<&BackendId> = table.backend_ids().collect();
    let backends = b
        .specs
        .into_iter()
        .filter(|(id, _)| used.contains(id))
        .collect();
    let mut diagnostics = b.diagnostics;
    diagnostics.sort();
    diagnostics.dedup();
    RoutePlan {
        table: Arc::new(table),
        backends,
        references: b.references,
        diagnostics,
        certs: Arc::new(certs.finish()),
        annotations: annotation_reports,
    }
}

/// The rules of a host where an Ingress says `use-regex` or `rewrite-target`: every path becomes
/// a case-insensitive regex prefix, as ingress-nginx's `location ~* "^<path>"`. A path that does
/// not compile is skipped with a diagnostic, and its Ingress's `use-regex`/`rewrite-target` are
/// reported `invalid-value`.
fn regex_rules(
    host: &HostKey,
    rules: Vec<(PathRule, String)>,
    diagnostics: &mut Vec<Diagnostic>,
    reports: &mut [super::AnnotationReport],
) -> Vec<PathRule> {
    let mut kept = Vec::with_capacity(rules.len());
    for (mut rule, pattern) in rules {
        match dataplane::table::RegexPath::new(&pattern) {
            Ok(regex) => {
                rule.matcher = PathMatch::Regex(regex);
                kept.push(rule);
            }
            Err(_) => {
                let error = super::nginx::regex_error(&pattern).unwrap_or_default();
                let origin = &rule.action.origin;
                diagnostics.push(Diagnostic::new(
                    ObjectKey::new(Kind::Ingress, &*origin.namespace, &*origin.name),
                    Reason::InvalidPath,
                    format!(
                        "path {pattern:?} on {} is a regex there (use-regex or rewrite-target on the host) that does not compile: {error}; skipped",
                        host.describe()
                    ),
                ));
                let report = reports.iter_mut().find(|r| {
                    *r.ingress.namespace == *origin.namespace && *r.ingress.name == *origin.name
                });
                if let Some(report) = report {
                    super::nginx::regex_failed(&mut report.annotations, &pattern, &error);
                }
            }
        }
    }
    kept
}

fn tie_key(rule: &PathRule) -> (bool, &str) {
    (
        matches!(rule.matcher, PathMatch::Exact(_)),
        rule.matcher.path(),
    )
}

fn match_kind(m: &PathMatch) -> &'static str {
    match m {
        PathMatch::Exact(_) => "Exact",
        PathMatch::Prefix(_) => "Prefix",
        PathMatch::ImplementationSpecific(_) => "ImplementationSpecific",
        PathMatch::Regex(_) => "regex",
    }
}

struct Builder<'a> {
    services: &'a BTreeMap<NsName, &'a Service>,
    diagnostics: Vec<Diagnostic>,
    references: References,
    specs: BTreeMap<BackendId, BackendSpec>,
}

impl Builder<'_> {
    /// The family policy of an Ingress: its annotation, else the global one.
    fn policy(&mut self, key: &ObjectKey, ingress: &Ingress, global: FamilyPolicy) -> FamilyPolicy {
        let value = ingress
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(UPSTREAM_FAMILY_ANNOTATION));
        match value.map(|v| v.trim().parse::<FamilyPolicy>()) {
            None => global,
            Some(Ok(policy)) => policy,
            Some(Err(error)) => {
                self.diagnostics.push(Diagnostic::new(
                    key.clone(),
                    Reason::InvalidAnnotation,
                    format!("{UPSTREAM_FAMILY_ANNOTATION}: {error}; using {global:?}"),
                ));
                global
            }
        }
    }

    /// The largest request body of an Ingress: its `duet.dev/proxy-body-size`, else the global.
    fn body_size(&mut self, key: &ObjectKey, ingress: &Ingress, global: u64) -> u64 {
        let value = ingress
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(BODY_SIZE_ANNOTATION));
        let bounded = |v: &str| {
            dataplane::limits::parse_size(v).filter(|&n| n <= crate::config::MAX_BODY_SIZE)
        };
        match value.map(|v| (v, bounded(v))) {
            None => global,
            Some((_, Some(size))) => size,
            Some((v, None)) => {
                self.diagnostics.push(Diagnostic::new(
                    key.clone(),
                    Reason::InvalidAnnotation,
                    format!(
                        "{BODY_SIZE_ANNOTATION}: {v:?} is not a size like 512, 8k or 10m of at most 64g; using {global} bytes"
                    ),
                ));
                global
            }
        }
    }

    /// Resolves an Ingress backend to a Service port; a diagnostic and `None` when it cannot.
    fn resolve(
        &mut self,
        key: &ObjectKey,
        backend: &IngressBackend,
        what: &str,
    ) -> Option<BackendId> {
        let Some(svc) = backend.service.as_ref() else {
            self.diagnostics.push(Diagnostic::new(
                key.clone(),
                Reason::UnsupportedBackend,
                format!("{what}: resource backends are not supported; skipped"),
            ));
            return None;
        };
        let name = NsName::new(key.namespace.clone(), svc.name.clone());
        self.references.services.insert(name.clone());
        let Some(service) = self.services.get(&name) else {
            self.diagnostics.push(Diagnostic::new(
                key.clone(),
                Reason::MissingService,
                format!("{what}: Service {name} does not exist; skipped"),
            ));
            return None;
        };
        let spec = service.spec.as_ref();
        if spec.and_then(|s| s.type_.as_deref()) == Some("ExternalName") {
            self.diagnostics.push(Diagnostic::new(
                key.clone(),
                Reason::UnsupportedBackend,
                format!("{what}: Service {name} is of type ExternalName, which is not supported; skipped"),
            ));
            return None;
        }
        let ports = spec.and_then(|s| s.ports.as_deref()).unwrap_or_default();
        let wanted = svc.port.as_ref();
        let (written, found) = match (
            wanted.and_then(|p| p.number),
            wanted.and_then(|p| p.name.as_deref()),
        ) {
            (Some(number), _) => (number.to_string(), ports.iter().find(|p| p.port == number)),
            (None, Some(port_name)) => (
                port_name.to_owned(),
                ports.iter().find(|p| p.name.as_deref() == Some(port_name)),
            ),
            (None, None) => {
                self.diagnostics.push(Diagnostic::new(
                    key.clone(),
                    Reason::UnknownServicePort,
                    format!("{what}: no port given for Service {name}; skipped"),
                ));
                return None;
            }
        };
        let Some(port) = found else {
            self.diagnostics.push(Diagnostic::new(
                key.clone(),
                Reason::UnknownServicePort,
                format!("{what}: Service {name} has no port {written}; skipped"),
            ));
            return None;
        };
        let id = BackendId::new(&name.namespace, &name.name, &written);
        let protocol = app_protocol(port.app_protocol.as_deref()).unwrap_or_else(|| {
            self.diagnostics.push(Diagnostic::new(
                ObjectKey::new(Kind::Service, &*name.namespace, &*name.name),
                Reason::UnsupportedAppProtocol,
                format!(
                    "port {written}: appProtocol {:?} is not supported; served as HTTP/1.1",
                    port.app_protocol.as_deref().unwrap_or_default()
                ),
            ));
            dataplane::table::UpstreamProtocol::Http1
        });
        self.specs.entry(id.clone()).or_insert_with(|| BackendSpec {
            service: name,
            port_name: port.name.clone().unwrap_or_default(),
            port: port.port,
            protocol,
        });
        Some(id)
    }

    /// The upstream TLS settings of a route of `ingress` to a resolved backend, spoken in
    /// `backend-protocol`'s protocol when the Ingress sets it (then unverified without a CA
    /// Secret, as in ingress-nginx).
    fn upstream_tls(
        &mut self,
        builder: &mut UpstreamTlsBuilder<'_>,
        key: &ObjectKey,
        ingress: &Ingress,
        id: &BackendId,
        nginx_protocol: Option<dataplane::table::UpstreamProtocol>,
    ) -> Option<Arc<dataplane::upstream_tls::UpstreamTls>> {
        let spec = self.specs.get(id)?;
        builder.route(
            key,
            ingress,
            &spec.service,
            (
                nginx_protocol.unwrap_or(spec.protocol),
                nginx_protocol.is_some(),
            ),
            &mut self.diagnostics,
            &mut self.references,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_lower_cased_and_wildcards_keyed_by_suffix() {
        assert_eq!(
            HostKey::parse(Some("Foo.Example.COM")),
            Ok(HostKey::Exact("foo.example.com".into()))
        );
        assert_eq!(
            HostKey::parse(Some("*.Example.com")),
            Ok(HostKey::Wildcard("example.com".into()))
        );
        assert_eq!(HostKey::parse(Some("")), Ok(HostKey::Any));
        assert_eq!(HostKey::parse(None), Ok(HostKey::Any));
        assert_eq!(
            HostKey::parse(Some("example.com.")),
            Ok(HostKey::Exact("example.com".into()))
        );
        for bad in ["*", "foo.*.com", "*.", "a..b", "exa mple.com", "*.*.x"] {
            assert!(HostKey::parse(Some(bad)).is_err(), "{bad}");
        }
    }
}
