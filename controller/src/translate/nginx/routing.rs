//! Where the traffic keys change the route model: a canary Ingress's rules become alternatives of
//! the main Ingress's rule of the same host and path (ingress-nginx's `mergeAlternativeBackends`:
//! at most one canary per host and path, a canary without a main Ingress is not served), and
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

    /// Attaches the canary to the main rules with its match among `rules` (its host's).
    pub fn attach<'r>(
        &self,
        rules: impl Iterator<Item = &'r mut PathRule>,
        diagnostics: &mut Vec<Diagnostic>,
    ) {
        attach(rules, &self.rule, &self.traffic, &self.written, diagnostics);
    }
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
fn attach<'r>(
    rules: impl Iterator<Item = &'r mut PathRule>,
    canary: &PathRule,
    traffic: &Traffic,
    written: &str,
    diagnostics: &mut Vec<Diagnostic>,
) {
    let origin = &canary.action.origin;
    let key = ObjectKey::new(Kind::Ingress, &*origin.namespace, &*origin.name);
    let mains: Vec<&mut PathRule> = rules.filter(|r| r.same_match(canary)).collect();
    if mains.is_empty() {
        diagnostics.push(Diagnostic::new(
            key,
            Reason::ConflictingPath,
            format!("canary path {written} has no main Ingress with the same host and path; not served (as in ingress-nginx)"),
        ));
        return;
    }
    for main in mains {
        let mut choice = main
            .action
            .choice
            .as_deref()
            .cloned()
            .unwrap_or_else(Choice::default);
        if !choice.alternatives.is_empty() {
            diagnostics.push(Diagnostic::new(
                key.clone(),
                Reason::ConflictingPath,
                format!(
                    "path {written} of Ingress {} already has a canary; this one is ignored (one canary per host and path, as in ingress-nginx)",
                    main.action.origin
                ),
            ));
            continue;
        }
        traffic.attach_canary(&mut choice, canary.action.backend.clone(), written);
        main.action.choice = Some(Arc::new(choice));
    }
}
