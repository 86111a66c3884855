//! Where the traffic keys change the route plan: a canary Ingress's rules become alternatives of
//! the main Ingress's rule of the same host and path (ingress-nginx's `mergeAlternativeBackends`:
//! at most one canary per host and path, a canary without a main Ingress is not served),
//! `from-to-www-redirect` adds the other spelling of the host answering 308, and
//! `service-upstream` swaps the pods for one target holding the Service's cluster IPs.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use dataplane::route_policy::Choice;
use dataplane::table::Redirect;
use dataplane::{BackendId, PathMatch, PathRule, Target, TargetId};
use k8s_openapi::api::core::v1::Service;

use super::super::{BackendSpec, Diagnostic, Reason};
use super::traffic::Traffic;
use crate::index::{Kind, NsName, ObjectKey};

/// Rules held back until every Ingress is read.
#[derive(Debug)]
pub struct Pending<K> {
    canaries: Vec<(K, PathRule, Traffic, String)>,
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

impl<K: Ord + Clone> Pending<K> {
    /// The backend of a rule: with `service-upstream`, the Service's cluster IPs instead of its
    /// pods (a headless Service keeps its pods, with a diagnostic). Not on a canary Ingress,
    /// whose `service-upstream` is reported ignored (the main Ingress's keys apply).
    pub fn backend(
        &mut self,
        traffic: &Traffic,
        id: BackendId,
        specs: &mut BTreeMap<BackendId, BackendSpec>,
        services: &BTreeMap<NsName, &Service>,
        diagnostics: &mut Vec<Diagnostic>,
        key: &ObjectKey,
    ) -> BackendId {
        if !traffic.service_upstream || traffic.canary {
            return id;
        }
        let Some(spec) = specs.get(&id) else {
            return id;
        };
        let ips = services
            .get(&spec.service)
            .map(|s| cluster_ips(s))
            .unwrap_or_default();
        if ips.is_empty() {
            diagnostics.push(Diagnostic::new(
                key.clone(),
                Reason::InvalidAnnotation,
                format!(
                    "nginx.ingress.kubernetes.io/service-upstream: Service {} has no cluster IP (headless); requests go to its pods",
                    spec.service
                ),
            ));
            return id;
        }
        let cluster = BackendId(format!("{id}/cluster-ip").into());
        let spec = BackendSpec {
            cluster_ips: ips,
            ..spec.clone()
        };
        specs.entry(cluster.clone()).or_insert(spec);
        cluster
    }

    /// Holds back a rule of a canary Ingress (true), and notes the rules of a
    /// `from-to-www-redirect` Ingress (false: they are served as usual).
    pub fn defer(&mut self, traffic: &Traffic, host: &K, rule: &PathRule, written: &str) -> bool {
        if traffic.canary {
            self.canaries.push((
                host.clone(),
                rule.clone(),
                traffic.clone(),
                written.to_owned(),
            ));
            return true;
        }
        if traffic.www_redirect {
            self.www.push((host.clone(), rule.clone()));
        }
        false
    }

    /// Attaches the canaries to their main rules and adds the `www` twins: `twin` gives a host's
    /// other spelling and the host's own name.
    pub fn apply(
        self,
        hosts: &mut BTreeMap<K, Vec<(PathRule, String)>>,
        diagnostics: &mut Vec<Diagnostic>,
        twin: impl Fn(&K) -> Option<(K, String)>,
    ) {
        for (host, canary, traffic, written) in self.canaries {
            attach(
                hosts.get_mut(&host),
                &canary,
                &traffic,
                &written,
                diagnostics,
            );
        }
        for (host, rule) in self.www {
            let Some((other, to)) = twin(&host).filter(|(o, _)| !hosts.contains_key(o)) else {
                continue;
            };
            let mut action = rule.action.clone();
            action.redirect = Some(Arc::new(Redirect {
                to_host: Some(to.into()),
                ..Redirect::default()
            }));
            action.choice = None;
            action.rewrite = None;
            let rule = PathRule {
                matcher: PathMatch::prefix("/"),
                action,
            };
            hosts.insert(other, vec![(rule, "/".to_owned())]);
        }
    }
}

/// Attaches one canary rule to the main rules of its host and path.
fn attach(
    rules: Option<&mut Vec<(PathRule, String)>>,
    canary: &PathRule,
    traffic: &Traffic,
    written: &str,
    diagnostics: &mut Vec<Diagnostic>,
) {
    let origin = &canary.action.origin;
    let key = ObjectKey::new(Kind::Ingress, &*origin.namespace, &*origin.name);
    let mains: Vec<&mut PathRule> = rules
        .into_iter()
        .flatten()
        .map(|(r, _)| r)
        .filter(|r| r.same_match(canary))
        .collect();
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

/// The cluster IPs of a Service (`spec.clusterIPs`, else `spec.clusterIP`), parsed; none for a
/// headless Service.
pub fn cluster_ips(service: &Service) -> Vec<IpAddr> {
    let Some(spec) = service.spec.as_ref() else {
        return Vec::new();
    };
    let listed = spec.cluster_ips.clone().unwrap_or_default();
    let listed = if listed.is_empty() {
        spec.cluster_ip.iter().cloned().collect()
    } else {
        listed
    };
    listed
        .iter()
        .filter_map(|ip| ip.trim().parse::<IpAddr>().ok())
        .map(|ip| ip.to_canonical())
        .collect()
}

/// The one target of a `service-upstream` backend: the Service's cluster IP of each family at the
/// Service port; forbidden addresses are dropped with a diagnostic.
pub fn cluster_target(spec: &BackendSpec, allow_loopback: bool) -> (Vec<Target>, Vec<Diagnostic>) {
    let mut diagnostics = Vec::new();
    let port = u16::try_from(spec.port).unwrap_or_default();
    let mut target = Target {
        id: TargetId(format!("service/{}", spec.service).into()),
        v4: None,
        v6: None,
        zone: None,
    };
    for ip in &spec.cluster_ips {
        if let Some(class) = super::super::forbidden(*ip, allow_loopback) {
            diagnostics.push(Diagnostic::new(
                ObjectKey::new(Kind::Service, &*spec.service.namespace, &*spec.service.name),
                Reason::ForbiddenEndpointAddress,
                format!("cluster IP {ip} is {class}; duet does not proxy to it (service-upstream)"),
            ));
            continue;
        }
        let slot = match ip {
            IpAddr::V4(_) => &mut target.v4,
            IpAddr::V6(_) => &mut target.v6,
        };
        slot.get_or_insert(SocketAddr::new(*ip, port));
    }
    let targets = if target.v4.is_some() || target.v6.is_some() {
        vec![target]
    } else {
        Vec::new()
    };
    (targets, diagnostics)
}
