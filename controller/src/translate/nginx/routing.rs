//! Where the traffic keys change the route model: a canary Ingress's rules become alternatives of
//! the main Ingress's rule of the same host and path (ingress-nginx's `mergeAlternativeBackends`:
//! at most one canary per host and path, a canary without a main Ingress is not served; under
//! [`CanaryScope::Namespace`] only a main Ingress of the canary's own namespace counts), and
//! `from-to-www-redirect` adds the other spelling of the host answering 308. Both wait until every
//! Ingress is read: the Ingress processor holds them in a [`Pending`] and settles them last.
//! (`service-upstream` is `Translation::cluster_ip_backend`.)

use std::sync::Arc;

use dataplane::route_policy::Choice;
use dataplane::table::Redirect;
use dataplane::{PathMatch, PathRule};

use super::super::{Diagnostic, Reason};
use super::traffic::Traffic;
use crate::object::{Kind, ObjectKey};

/// Which main Ingresses a canary Ingress may attach to (`--canary-scope`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CanaryScope {
    /// Those of its own namespace only: an Ingress author cannot take another namespace's traffic.
    #[default]
    Namespace,
    /// Those of any namespace, as ingress-nginx.
    Cluster,
}

impl CanaryScope {
    /// The flag value: `namespace` or `cluster`.
    pub fn as_str(self) -> &'static str {
        match self {
            CanaryScope::Namespace => "namespace",
            CanaryScope::Cluster => "cluster",
        }
    }
}

impl std::str::FromStr for CanaryScope {
    type Err = String;

    fn from_str(s: &str) -> Result<CanaryScope, String> {
        [CanaryScope::Namespace, CanaryScope::Cluster]
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| format!("{s:?} is not a canary scope (namespace or cluster)"))
    }
}

/// Rules held back until every Ingress is read.
#[derive(Debug)]
pub struct Pending<K> {
    canaries: Vec<Canary<K>>,
    www: Vec<(K, PathRule)>,
}

impl<K> Default for Pending<K> {
    fn default() -> Self {
        Pending {
            canaries: Vec::new(),
            www: Vec::new(),
        }
    }
}

/// A rule of a canary Ingress, held back until its main rule is known.
#[derive(Debug)]
pub struct Canary<K> {
    /// The rule's host.
    pub host: K,
    rule: PathRule,
    traffic: Traffic,
    written: String,
}

impl<K: Clone> Pending<K> {
    /// Holds back a rule of a canary Ingress (true), and notes the rules of a
    /// `from-to-www-redirect` Ingress (false: they are served as usual).
    pub fn defer(&mut self, traffic: &Traffic, host: &K, rule: &PathRule, written: &str) -> bool {
        if traffic.canary {
            self.canaries.push(Canary {
                host: host.clone(),
                rule: rule.clone(),
                traffic: traffic.clone(),
                written: written.to_owned(),
            });
            return true;
        }
        if traffic.www_redirect {
            self.www.push((host.clone(), rule.clone()));
        }
        false
    }

    /// The canary rules held back, and the rules (by host) whose host's other spelling redirects
    /// to it.
    pub fn into_parts(self) -> (Vec<Canary<K>>, Vec<(K, PathRule)>) {
        (self.canaries, self.www)
    }
}

impl<K> Canary<K> {
    /// The canary Ingress.
    pub fn origin(&self) -> &dataplane::Origin {
        &self.rule.action.origin
    }

    /// Attaches the canary to the main rules with its match among `rules` (its host's) that
    /// `scope` lets it reach.
    pub fn attach<'r>(
        &self,
        rules: impl Iterator<Item = &'r mut PathRule>,
        scope: CanaryScope,
        diagnostics: &mut Vec<Diagnostic>,
    ) {
        let (mains, foreign) = in_scope(rules, &self.rule, scope);
        let written = &self.written;
        if mains.is_empty() {
            let message = match foreign {
                Some(other) => format!("canary path {written} matches Ingress {other} of another namespace; not served (--canary-scope=namespace: a canary attaches to its own namespace's Ingresses only)"),
                None => format!("canary path {written} has no main Ingress with the same host and path; not served (as in ingress-nginx)"),
            };
            diagnostics.push(Diagnostic::new(
                self.key(),
                Reason::ConflictingPath,
                message,
            ));
            return;
        }
        attach(mains, self, diagnostics);
    }

    fn key(&self) -> ObjectKey {
        let origin = self.origin();
        ObjectKey::new(Kind::Ingress, &*origin.namespace, &*origin.name)
    }
}

/// The main rules with the canary's match that `scope` lets it attach to, and the Ingress of one
/// it may not (another namespace's under [`CanaryScope::Namespace`]).
fn in_scope<'r>(
    rules: impl Iterator<Item = &'r mut PathRule>,
    canary: &PathRule,
    scope: CanaryScope,
) -> (Vec<&'r mut PathRule>, Option<dataplane::Origin>) {
    let own = &canary.action.origin.namespace;
    let mut foreign = None;
    let mains = rules
        .filter(|r| r.same_match(canary))
        .filter(|r| {
            let reachable = scope == CanaryScope::Cluster || r.action.origin.namespace == *own;
            if !reachable {
                foreign.get_or_insert_with(|| (*r.action.origin).clone());
            }
            reachable
        })
        .collect();
    (mains, foreign)
}

/// The one rule of the other spelling of a `from-to-www-redirect` host: every path answers 308
/// to `to`, the host `rule` is on.
pub fn www_rule(rule: &PathRule, to: &str) -> PathRule {
    let mut action = rule.action.clone();
    action.redirect = Some(Arc::new(Redirect {
        to_host: Some(to.into()),
        ..Redirect::default()
    }));
    action.choice = None;
    action.rewrite = None;
    PathRule::new(PathMatch::prefix("/"), action)
}

/// Attaches one canary rule to the main rules of its host and path.
fn attach<K>(mains: Vec<&mut PathRule>, canary: &Canary<K>, diagnostics: &mut Vec<Diagnostic>) {
    let written = &canary.written;
    for main in mains {
        let mut choice = main
            .action
            .choice
            .as_deref()
            .cloned()
            .unwrap_or_else(Choice::default);
        if !choice.alternatives.is_empty() {
            diagnostics.push(Diagnostic::new(
                canary.key(),
                Reason::ConflictingPath,
                format!(
                    "path {written} of Ingress {} already has a canary; this one is ignored (one canary per host and path, as in ingress-nginx)",
                    main.action.origin
                ),
            ));
            continue;
        }
        let backend = canary.rule.action.backend.clone();
        canary.traffic.attach_canary(&mut choice, backend, written);
        main.action.choice = Some(Arc::new(choice));
    }
}
