//! BackendTLSPolicy: how duet speaks TLS to the Services a policy targets, and the policy's
//! status. Pure: the policies and ConfigMaps in, [`UpstreamTls`] settings and a
//! [`PolicyReport`] per policy out.
//!
//! - Targets: `targetRefs` of kind `Service` (core group); with `sectionName`, the Service port of
//!   that name, else every port of the Service that no policy names by section.
//! - Conflicts: of the policies with the same target (Service and section), the oldest
//!   (creationTimestamp, then namespace/name) applies; the others are `Accepted: False`,
//!   reason `Conflicted`, for that target.
//! - Validation: `hostname` is sent as SNI and checked in the certificate, unless
//!   `subjectAltNames` are given (then one of them is checked, never the pod's address);
//!   `caCertificateRefs` name ConfigMaps of the policy's namespace (key `ca.crt`) or
//!   `wellKnownCACertificates: System` the system roots. A ref of another kind is
//!   `ResolvedRefs: False` `InvalidKind`, a missing ConfigMap or one without a usable certificate
//!   `InvalidCACertificateRef`; with no usable CA at all the policy is `Accepted: False`
//!   `NoValidCACertificate` and the requests to its targets answer 502.
//! - Ancestors: the Gateways whose attached routes use a targeted Service port.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use dataplane::upstream_tls::{SubjectAltName, UpstreamTls, UpstreamTrust};
use k8s_openapi::api::core::v1::ConfigMap;

use crate::gateway_api::backendtlspolicies::{
    BackendTlsPolicyValidation, BackendTlsPolicyValidationSubjectAltNamesType as SanType,
};
use crate::gateway_api::conditions::Cond;
use crate::gateway_api::report::PolicyReport;
use crate::gateway_api::BackendTlsPolicy;
use crate::object::NsName;

/// The key of the CA bundle in a CA ConfigMap.
const CA_KEY: &str = "ca.crt";

/// A policy target: the Service and the port name (`None`: every port no policy names).
type Target = (NsName, Option<String>);

/// One policy, judged.
#[derive(Debug)]
struct Judged {
    key: NsName,
    generation: Option<i64>,
    /// What the settings are made of, or why there are none (requests answer 502).
    settings: Result<Settings, String>,
    /// `ResolvedRefs`.
    resolved: Cond,
    /// Whether an older policy has one of its targets.
    conflicted: bool,
}

/// What a valid policy's [`UpstreamTls`] is made of.
#[derive(Debug)]
struct Settings {
    hostname: String,
    trust: UpstreamTrust,
    names: Vec<SubjectAltName>,
}

/// The BackendTLSPolicies in force, with what the routes of our Gateways used of them.
#[derive(Debug, Default)]
pub struct Policies {
    judged: Vec<Judged>,
    /// The policies of each target, oldest (the one that applies) first.
    by_target: BTreeMap<Target, Vec<usize>>,
    /// Settings made, per policy and ALPN h2.
    built: BTreeMap<(usize, bool), Arc<UpstreamTls>>,
    /// Per policy: the Gateways whose routes used it.
    ancestors: BTreeMap<usize, BTreeSet<NsName>>,
    /// The policies used by the route being added (see [`Policies::used_by`]).
    pending: BTreeSet<usize>,
}

impl Policies {
    /// Judges every policy against the ConfigMaps of its namespace.
    pub fn new(policies: &[&BackendTlsPolicy], config_maps: &[&ConfigMap]) -> Policies {
        let maps: BTreeMap<NsName, &ConfigMap> = config_maps
            .iter()
            .map(|c| (NsName::of(&c.metadata), *c))
            .collect();
        let mut sorted: Vec<&BackendTlsPolicy> = policies.to_vec();
        sorted.sort_by_key(|p| {
            (
                p.metadata.creation_timestamp.clone(),
                NsName::of(&p.metadata),
            )
        });
        let mut out = Policies::default();
        for policy in sorted {
            let key = NsName::of(&policy.metadata);
            let (settings, resolved) = validation(&key.namespace, &policy.spec.validation, &maps);
            let mut conflicted = false;
            let index = out.judged.len();
            for t in policy.spec.target_refs.iter() {
                if !t.group.is_empty() || t.kind != "Service" {
                    continue;
                }
                let target = (
                    NsName::new(key.namespace.clone(), t.name.clone()),
                    t.section_name.clone(),
                );
                let list = out.by_target.entry(target).or_default();
                if list.first().is_some_and(|&first| first != index) {
                    conflicted = true;
                }
                if !list.contains(&index) {
                    list.push(index);
                }
            }
            out.judged.push(Judged {
                key,
                generation: policy.metadata.generation,
                settings,
                resolved,
                conflicted,
            });
        }
        out
    }

    /// The TLS settings of a backend: the policy of the Service port named `port` (else of
    /// the whole Service), for ALPN `h2` or `http/1.1`; `None` when no policy targets it.
    pub fn for_backend(
        &mut self,
        service: &NsName,
        port: Option<&str>,
        h2: bool,
    ) -> Option<Arc<UpstreamTls>> {
        let named = port.and_then(|p| self.by_target.get(&(service.clone(), Some(p.to_owned()))));
        let list = named.or_else(|| self.by_target.get(&(service.clone(), None)))?;
        // The conflicted ones get the same ancestors, to say so in their status.
        self.pending.extend(list.iter().copied());
        let index = *list.first()?;
        let judged = &self.judged[index];
        let built = self.built.entry((index, h2)).or_insert_with(|| {
            Arc::new(match &judged.settings {
                Ok(s) => match UpstreamTls::new(&s.hostname, &s.trust, h2) {
                    Ok(tls) => tls.with_subject_alt_names(s.names.clone()),
                    Err(e) => UpstreamTls::unusable(&s.hostname, &s.trust, &e.to_string()),
                },
                Err(reason) => UpstreamTls::unusable(
                    "invalid.invalid",
                    &UpstreamTrust::SystemRoots,
                    &format!("BackendTLSPolicy {}: {reason}", judged.key),
                ),
            })
        });
        Some(built.clone())
    }

    /// The policies used since the last call become the policies of `gateways`.
    pub fn used_by<'g>(&mut self, gateways: impl IntoIterator<Item = &'g NsName> + Clone) {
        for index in std::mem::take(&mut self.pending) {
            let set = self.ancestors.entry(index).or_default();
            set.extend(gateways.clone().into_iter().cloned());
        }
    }

    /// The status of every policy some route of our Gateways used.
    pub fn report(&self) -> BTreeMap<NsName, PolicyReport> {
        self.ancestors
            .iter()
            .filter(|(_, gateways)| !gateways.is_empty())
            .map(|(&index, gateways)| {
                let j = &self.judged[index];
                let accepted = if j.conflicted {
                    let message = "an older BackendTLSPolicy targets the same Service port";
                    Cond::no("Accepted", "Conflicted", message)
                } else if let Err(reason) = &j.settings {
                    Cond::no("Accepted", "NoValidCACertificate", reason.clone())
                } else {
                    Cond::yes("Accepted", "Accepted", "")
                };
                let report = PolicyReport {
                    generation: j.generation,
                    ancestors: gateways.clone(),
                    conditions: vec![accepted, j.resolved.clone()],
                };
                (j.key.clone(), report)
            })
            .collect()
    }
}

/// The settings of a policy's `validation` and its `ResolvedRefs` condition.
fn validation(
    namespace: &str,
    v: &BackendTlsPolicyValidation,
    maps: &BTreeMap<NsName, &ConfigMap>,
) -> (Result<Settings, String>, Cond) {
    let mut problem: Option<Cond> = None;
    let mut pem: Vec<u8> = Vec::new();
    let mut sources: Vec<String> = Vec::new();
    for r in v.ca_certificate_refs.iter().flatten() {
        if !r.group.is_empty() || r.kind != "ConfigMap" {
            let message = format!(
                "caCertificateRef {}: kind {:?} of group {:?} is not supported",
                r.name, r.kind, r.group
            );
            problem.get_or_insert(Cond::no("ResolvedRefs", "InvalidKind", message));
            continue;
        }
        let name = NsName::new(namespace, r.name.clone());
        match ca_pem(maps.get(&name).copied(), &v.hostname) {
            Ok(bundle) => {
                pem.extend_from_slice(bundle.as_bytes());
                pem.push(b'\n');
                sources.push(name.to_string());
            }
            Err(why) => {
                let message = format!("caCertificateRef ConfigMap {name}: {why}");
                problem.get_or_insert(Cond::no("ResolvedRefs", "InvalidCACertificateRef", message));
            }
        }
    }
    let resolved = problem.unwrap_or_else(|| Cond::yes("ResolvedRefs", "ResolvedRefs", ""));
    let trust = if !sources.is_empty() {
        Ok(UpstreamTrust::Ca {
            source: sources.join(",").into(),
            pem,
        })
    } else if v
        .well_known_ca_certificates
        .as_deref()
        .is_some_and(|w| w.eq_ignore_ascii_case("System"))
    {
        Ok(UpstreamTrust::SystemRoots)
    } else {
        Err("no usable CA certificate".to_owned())
    };
    let names = v
        .subject_alt_names
        .iter()
        .flatten()
        .filter_map(|n| match n.r#type {
            SanType::Hostname => n
                .hostname
                .as_deref()
                .map(|h| SubjectAltName::Hostname(h.into())),
            SanType::Uri => n.uri.as_deref().map(|u| SubjectAltName::Uri(u.into())),
        })
        .collect();
    let settings = trust.map(|trust| Settings {
        hostname: v.hostname.clone(),
        trust,
        names,
    });
    (settings, resolved)
}

/// The `ca.crt` of a ConfigMap, when it holds a certificate usable as a root.
fn ca_pem(map: Option<&ConfigMap>, hostname: &str) -> Result<String, String> {
    let map = map.ok_or("does not exist")?;
    let pem = map
        .data
        .as_ref()
        .and_then(|d| d.get(CA_KEY))
        .ok_or(format!("has no {CA_KEY}"))?;
    let trust = UpstreamTrust::Ca {
        source: "check".into(),
        pem: pem.as_bytes().to_vec(),
    };
    let name = if dataplane::upstream_tls::valid_server_name(hostname) {
        hostname
    } else {
        "example.com"
    };
    UpstreamTls::new(name, &trust, false)
        .map(|_| pem.clone())
        .map_err(|_| format!("{CA_KEY} holds no usable PEM certificate"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn policy(
        name: &str,
        age: i64,
        service: &str,
        section: Option<&str>,
        ca: Value,
    ) -> BackendTlsPolicy {
        let mut target = json!({"group": "", "kind": "Service", "name": service});
        if let Some(s) = section {
            target["sectionName"] = json!(s);
        }
        serde_json::from_value(json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "BackendTLSPolicy",
            "metadata": {"name": name, "namespace": "ns", "generation": 3,
                         "creationTimestamp": format!("2026-01-01T00:00:{age:02}Z")},
            "spec": {"targetRefs": [target],
                     "validation": {"caCertificateRefs": [ca], "hostname": "abc.example.com"}}
        }))
        .unwrap()
    }

    use serde_json::Value;

    fn ca_ref(kind: &str, name: &str) -> Value {
        json!({"group": "", "kind": kind, "name": name})
    }

    fn ca_map(name: &str, pem: &str) -> ConfigMap {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns"}, "data": {"ca.crt": pem}
        }))
        .unwrap()
    }

    fn conditions(
        report: &BTreeMap<NsName, PolicyReport>,
        name: &str,
    ) -> Vec<(bool, &'static str)> {
        report[&NsName::new("ns", name)]
            .conditions
            .iter()
            .map(|c| (c.status, c.reason))
            .collect()
    }

    #[test]
    fn the_oldest_policy_of_a_target_applies_and_the_others_say_conflicted() {
        let pem = rcgen::generate_simple_self_signed(vec!["ca".to_owned()])
            .unwrap()
            .cert
            .pem();
        let maps = [ca_map("ca", &pem)];
        let ok = ca_ref("ConfigMap", "ca");
        let policies = [
            policy("newer", 2, "web", None, ok.clone()),
            policy("older", 1, "web", None, ok.clone()),
            policy("section", 3, "web", Some("https"), ok.clone()),
            policy("bad-kind", 4, "other", None, ca_ref("Secret", "ca")),
            policy("missing", 5, "gone", None, ca_ref("ConfigMap", "nope")),
        ];
        let refs: Vec<&BackendTlsPolicy> = policies.iter().collect();
        let map_refs: Vec<&ConfigMap> = maps.iter().collect();
        let mut p = Policies::new(&refs, &map_refs);
        let web = NsName::new("ns", "web");
        // The port named by a section gets that policy, the others the Service-wide one.
        let named = p.for_backend(&web, Some("https"), false).unwrap();
        let whole = p.for_backend(&web, Some("http"), false).unwrap();
        assert!(named.error().is_none() && whole.error().is_none());
        let bad = p
            .for_backend(&NsName::new("ns", "other"), None, false)
            .unwrap();
        assert!(bad.error().is_some(), "no CA: requests answer 502");
        p.for_backend(&NsName::new("ns", "gone"), None, true);
        assert!(p
            .for_backend(&NsName::new("ns", "plain"), None, false)
            .is_none());
        let gw = NsName::new("ns", "gw");
        p.used_by([&gw]);
        let report = p.report();
        assert_eq!(
            report[&NsName::new("ns", "older")].ancestors,
            BTreeSet::from([gw.clone()])
        );
        assert_eq!(report[&NsName::new("ns", "older")].generation, Some(3));
        assert_eq!(
            conditions(&report, "older"),
            [(true, "Accepted"), (true, "ResolvedRefs")]
        );
        assert_eq!(
            conditions(&report, "newer"),
            [(false, "Conflicted"), (true, "ResolvedRefs")]
        );
        assert_eq!(
            conditions(&report, "section"),
            [(true, "Accepted"), (true, "ResolvedRefs")]
        );
        assert_eq!(
            conditions(&report, "bad-kind"),
            [(false, "NoValidCACertificate"), (false, "InvalidKind")]
        );
        assert_eq!(
            conditions(&report, "missing"),
            [
                (false, "NoValidCACertificate"),
                (false, "InvalidCACertificateRef")
            ]
        );
    }

    #[test]
    fn a_policy_no_route_uses_has_no_status() {
        let policies = [policy("idle", 1, "web", None, ca_ref("ConfigMap", "ca"))];
        let refs: Vec<&BackendTlsPolicy> = policies.iter().collect();
        let mut p = Policies::new(&refs, &[]);
        p.used_by([&NsName::new("ns", "gw")]);
        assert!(p.report().is_empty());
    }
}
