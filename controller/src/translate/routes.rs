//! The route model every processor feeds, and the route table it becomes. Hosts are keyed by
//! [`HostKey`]: lower case, `*.suffix` wildcards by their suffix, no host for rules that apply to
//! hosts without an entry of their own.
//!
//! - Rules of one host are merged across objects and sorted by precedence; an identical match of
//!   lower precedence is a `ConflictingPath` diagnostic.
//! - The default backend is the first one claimed (processors claim oldest first); later ones get
//!   `DuplicateDefaultBackend`.
//! - A host where any rule asks for regexes (ingress-nginx's `use-regex` or `rewrite-target`)
//!   matches every one of its paths as a case-insensitive regex prefix; a path that does not
//!   compile is skipped (`InvalidPath`).

use std::borrow::Cow;
use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use dataplane::table::passthrough::Passthrough;
use dataplane::table::HostRules;
use dataplane::{Origin, PathMatch, PathRule, RouteAction, RouteTable};

use super::{AnnotationReport, Diagnostic, Reason};
use crate::object::{Kind, ObjectKey};

/// Where a rule's host puts it in the table.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum HostKey {
    /// An exact host, lower case.
    Exact(String),
    /// A `*.` wildcard, by the suffix after `*.`, lower case.
    Wildcard(String),
    /// No host.
    Any,
}

/// Whether `name` is dot-separated labels, none empty, each of ASCII letters, digits, `-` and
/// `_`; in one pass over the bytes (10,000 hosts per full build at the 10k-Ingress size).
fn is_dns_name(name: &str) -> bool {
    let mut label = 0usize;
    for &b in name.as_bytes() {
        match b {
            b'.' if label == 0 => return false,
            b'.' => label = 0,
            b if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' => label += 1,
            _ => return false,
        }
    }
    label > 0
}

impl HostKey {
    pub(crate) fn parse(host: Option<&str>) -> Result<HostKey, String> {
        let host = host.unwrap_or_default().trim();
        if host.is_empty() {
            return Ok(HostKey::Any);
        }
        let name = host.strip_suffix('.').unwrap_or(host);
        let (wild, name) = match name.strip_prefix("*.") {
            Some(suffix) => (true, suffix),
            None => (false, name),
        };
        if !is_dns_name(name) {
            return Err(format!(
                "host {host:?} is neither a DNS name nor a \"*.\" wildcard; rule skipped"
            ));
        }
        // Checked as written (lowercasing changes no byte's validity), then lowered once.
        let name = name.to_ascii_lowercase();
        Ok(if wild {
            HostKey::Wildcard(name)
        } else {
            HostKey::Exact(name)
        })
    }

    /// The host as written in a rule (`*.` before a wildcard's suffix; empty for no host).
    pub(crate) fn display(&self) -> Cow<'_, str> {
        match self {
            HostKey::Exact(h) => Cow::Borrowed(h),
            HostKey::Wildcard(s) => Cow::Owned(format!("*.{s}")),
            HostKey::Any => Cow::Borrowed(""),
        }
    }

    /// `host <host>` or `any host`, for messages.
    pub(crate) fn describe(&self) -> String {
        self.described().to_string()
    }

    /// [`describe`](Self::describe) written only when formatted.
    pub(crate) fn described(&self) -> Described<'_> {
        Described(self)
    }
}

/// A host for messages: see [`HostKey::describe`].
pub(crate) struct Described<'h>(&'h HostKey);

impl fmt::Display for Described<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            HostKey::Any => f.write_str("any host"),
            other => write!(f, "host {}", other.display()),
        }
    }
}

/// Hosts and paths as the processors add them, before precedence and conflicts are settled.
#[derive(Debug, Default)]
pub(crate) struct RouteModel {
    /// Each rule with the regex it becomes if its host turns to regexes.
    hosts: BTreeMap<HostKey, Vec<(PathRule, String)>>,
    /// The rules added last, on one host, not yet in `hosts` (they follow that host's rules
    /// there): an Ingress adds its paths host by host, and each path looked its host up in the
    /// B-tree, comparing host names.
    pending: Option<(HostKey, Vec<(PathRule, String)>)>,
    /// Hosts whose paths are regexes.
    regex_hosts: BTreeSet<HostKey>,
    /// The default backend, once claimed.
    default_backend: Option<RouteAction>,
    /// Exact hosts an Ingress with `ssl-passthrough` names, with the first such Ingress.
    passthrough: BTreeMap<String, Origin>,
}

impl RouteModel {
    /// Adds a path rule on `host`; `pattern` is the regex it becomes where the host's paths are
    /// regexes, and `own_regex` says that this rule turns them so.
    pub(crate) fn add(&mut self, host: &HostKey, rule: PathRule, pattern: &str, own_regex: bool) {
        if own_regex {
            self.use_regex(host);
        }
        let entry = (rule, pattern.to_owned());
        match &mut self.pending {
            Some((last, rules)) if last == host => rules.push(entry),
            _ => {
                self.flush();
                self.pending = Some((host.clone(), vec![entry]));
            }
        }
    }

    /// Moves the pending rules to the end of their host's in `hosts`.
    fn flush(&mut self) {
        if let Some((host, mut rules)) = self.pending.take() {
            match self.hosts.entry(host) {
                Entry::Occupied(known) => known.into_mut().append(&mut rules),
                Entry::Vacant(new) => {
                    new.insert(rules);
                }
            }
        }
    }

    /// Turns the paths of `host` to regexes (a rule asking for them, added or not).
    pub(crate) fn use_regex(&mut self, host: &HostKey) {
        self.regex_hosts.insert(host.clone());
    }

    /// Whether `host` has rules.
    pub(crate) fn has_host(&self, host: &HostKey) -> bool {
        self.pending.as_ref().is_some_and(|(last, _)| last == host) || self.hosts.contains_key(host)
    }

    /// The rules added on `host` so far, to change their actions.
    pub(crate) fn rules_mut(&mut self, host: &HostKey) -> impl Iterator<Item = &mut PathRule> {
        self.flush();
        self.hosts
            .get_mut(host)
            .into_iter()
            .flatten()
            .map(|(rule, _)| rule)
    }

    /// Marks an exact host as passed through (ingress-nginx's `ssl-passthrough`) by the
    /// Ingress `origin`.
    pub(crate) fn passthrough(&mut self, host: &str, origin: &Origin) {
        self.passthrough
            .entry(host.to_owned())
            .or_insert_with(|| origin.clone());
    }

    /// Who holds the default backend, if anyone does yet.
    pub(crate) fn default_holder(&self) -> Option<&Origin> {
        self.default_backend.as_ref().map(|a| &*a.origin)
    }

    /// Sets the default backend (the caller has checked [`default_holder`](Self::default_holder)).
    pub(crate) fn set_default(&mut self, action: RouteAction) {
        self.default_backend = Some(action);
    }

    /// Takes the hosts of a model built from other Ingresses, over hosts this one lacks (a route
    /// phase split by host); its default backend when this one has none.
    pub(crate) fn absorb(&mut self, mut other: RouteModel) {
        self.flush();
        other.flush();
        debug_assert!(other.hosts.keys().all(|h| !self.hosts.contains_key(h)));
        self.hosts.append(&mut other.hosts);
        self.regex_hosts.append(&mut other.regex_hosts);
        if self.default_backend.is_none() {
            self.default_backend = other.default_backend;
        }
        for (host, origin) in other.passthrough {
            self.passthrough.entry(host).or_insert(origin);
        }
    }

    /// The route table: each host's rules in precedence order, conflicts and paths that do not
    /// compile as regexes reported.
    pub(crate) fn build(
        mut self,
        diagnostics: &mut Vec<Diagnostic>,
        reports: &mut [AnnotationReport],
    ) -> RouteTable {
        self.flush();
        let mut table = RouteTable {
            default_backend: self.default_backend,
            ..RouteTable::default()
        };
        let passthrough = self.passthrough;
        // Sized once: 10,000 hosts at the 10k-Ingress size grew the map by rehashing 14 times.
        let exact = self.hosts.keys().filter(|h| matches!(h, HostKey::Exact(_)));
        table.exact.reserve(exact.count());
        for (host, rules) in self.hosts {
            let rules = if self.regex_hosts.contains(&host) {
                regex_rules(&host, rules, diagnostics, reports)
            } else {
                rules.into_iter().map(|(rule, _)| rule).collect()
            };
            let entry = host_rules(&host, rules, diagnostics);
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
        for (host, origin) in passthrough {
            passthrough_host(&mut table, host, &origin, diagnostics);
        }
        table
    }
}

/// Relays a passthrough host's connections to the backend of its `/` rule (the rule that wins
/// for `/`, whichever Ingress wrote it, as ingress-nginx's root location); a host without one is
/// terminated as any other, with a diagnostic.
fn passthrough_host(
    table: &mut RouteTable,
    host: String,
    origin: &Origin,
    diagnostics: &mut Vec<Diagnostic>,
) {
    let root = table
        .exact
        .get(host.as_str())
        .and_then(|h| h.rules.iter().find(|r| r.matcher.path() == "/"));
    let Some(rule) = root else {
        diagnostics.push(Diagnostic::new(
            origin_key(origin),
            Reason::IgnoredAnnotation,
            format!(
                "nginx.ingress.kubernetes.io/ssl-passthrough: host {host} has no rule for path /; its HTTPS connections are terminated by duet"
            ),
        ));
        return;
    };
    let to = Passthrough {
        backend: rule.action.backend.clone(),
        policy: rule.action.policy,
        origin: rule.action.origin.clone(),
    };
    table.passthrough.insert(host.into(), to);
}

/// One host's rules in precedence order; each rule that loses to an identical match is a
/// `ConflictingPath` diagnostic.
fn host_rules(
    host: &HostKey,
    mut rules: Vec<PathRule>,
    diagnostics: &mut Vec<Diagnostic>,
) -> HostRules {
    // Rules of equal precedence that cannot match the same request (same length, different
    // paths) would otherwise keep input order: order them by path so the table is the same
    // whatever the input order. The sort is stable, so of two rules with the same match in
    // one Ingress the first written still wins.
    rules.sort_by(|a, b| tie_key(a).cmp(&tie_key(b)));
    let (entry, conflicts) = HostRules::new(&host.display(), rules);
    for lost in conflicts {
        let winner = entry.rules.iter().find(|k| k.same_match(&lost));
        diagnostics.push(conflict(host, &lost, winner));
    }
    entry
}

/// The diagnostic of a rule that lost to `winner`'s identical match.
fn conflict(host: &HostKey, lost: &PathRule, winner: Option<&PathRule>) -> Diagnostic {
    let by = match winner {
        Some(w) if w.action.origin == lost.action.origin => {
            "an earlier rule of the same Ingress".to_owned()
        }
        Some(w) => format!("Ingress {}", w.action.origin),
        None => "another rule".to_owned(),
    };
    Diagnostic::new(
        origin_key(&lost.action.origin),
        Reason::ConflictingPath,
        format!(
            "{} path {} on {} is already routed by {by}; this rule is ignored",
            match_kind(&lost.matcher),
            lost.matcher.path(),
            host.describe(),
        ),
    )
}

/// The key of the Ingress a route came from.
pub(crate) fn origin_key(origin: &Origin) -> ObjectKey {
    ObjectKey::new(Kind::Ingress, &*origin.namespace, &*origin.name)
}

/// The rules of a host where an Ingress says `use-regex` or `rewrite-target`: every path becomes
/// a case-insensitive regex prefix, as ingress-nginx's `location ~* "^<path>"`. A path that does
/// not compile is skipped with a diagnostic, and its Ingress's `use-regex`/`rewrite-target` are
/// reported `invalid-value`.
fn regex_rules(
    host: &HostKey,
    rules: Vec<(PathRule, String)>,
    diagnostics: &mut Vec<Diagnostic>,
    reports: &mut [AnnotationReport],
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
                    origin_key(origin),
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
        for bad in [
            "*",
            "foo.*.com",
            "*.",
            "a..b",
            "exa mple.com",
            "*.*.x",
            ".a",
            "a..",
            "é.com",
        ] {
            assert!(HostKey::parse(Some(bad)).is_err(), "{bad}");
        }
    }

    /// The rule as first written: lowered, split on dots, each label checked.
    fn reference(host: &str) -> Option<HostKey> {
        let host = host.trim();
        if host.is_empty() {
            return Some(HostKey::Any);
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
        valid.then(|| match wild {
            true => HostKey::Wildcard(name.to_owned()),
            false => HostKey::Exact(name.to_owned()),
        })
    }

    proptest::proptest! {
        #[test]
        fn hosts_parse_as_the_label_by_label_rule(host in "[ *.aZ9_é-]{0,12}") {
            proptest::prop_assert_eq!(HostKey::parse(Some(&host)).ok(), reference(&host));
        }
    }
}
