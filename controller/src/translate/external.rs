//! ExternalName Services as backends: the Service's `spec.externalName` is ONE target holding
//! the name's IPv4 and IPv6 addresses, so the family policy and the per-family fallback apply to
//! it as to a dual-stack pod.
//!
//! Translation stays pure: an IP literal becomes the target directly; a DNS name is looked up by
//! the controller's resolver task ([`crate::resolve`]), whose latest answers come in as
//! [`Inputs::names`](super::Inputs::names) and are joined here in the backend phase. A name
//! without an answer yet has no target (503); a failed lookup keeps the last good answer, an
//! authoritative "no such name" (NXDOMAIN) or "no A/AAAA records" leaves none; both with a
//! `UnresolvedExternalName` diagnostic of the Service.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use dataplane::{Target, TargetId};
use k8s_openapi::api::core::v1::ServicePort;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{forbidden, BackendSpec, Diagnostic, Reason, RoutePlan};
use crate::object::{Kind, ObjectKey};
use crate::stored::ServiceView;

/// The latest answer for one name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resolution {
    /// The IPv4 addresses (A records), sorted.
    pub v4: Vec<Ipv4Addr>,
    /// The IPv6 addresses (AAAA records), sorted.
    pub v6: Vec<Ipv6Addr>,
    /// What went wrong at the last lookup (and what is served instead), if anything.
    pub problem: Option<String>,
}

/// The resolver's answers, by name as the Services write it.
pub type Resolved = BTreeMap<Arc<str>, Resolution>;

/// What an ExternalName Service points at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ExternalName {
    /// An IP literal: the target, no lookup.
    Ip(IpAddr),
    /// A DNS name to look up (lower case, without a trailing dot).
    Name(Arc<str>),
}

/// Whether `service` is of type `ExternalName`.
pub(crate) fn is_external(service: &dyn ServiceView) -> bool {
    service.service_type() == Some("ExternalName")
}

/// The Service's `spec.externalName`, checked: an IP literal or a DNS name (labels of letters,
/// digits and `-`, at most 63 bytes each, 253 in all); the reason otherwise.
pub(crate) fn external_name(service: &dyn ServiceView) -> Result<ExternalName, String> {
    let written = service.external_name().unwrap_or_default().trim();
    if let Ok(ip) = written.parse::<IpAddr>() {
        return Ok(ExternalName::Ip(ip.to_canonical()));
    }
    let name = written.strip_suffix('.').unwrap_or(written);
    let label_ok = |l: &str| {
        (1..=63).contains(&l.len())
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
        return Err(format!(
            "externalName {written:?} is not a DNS name or an IP address"
        ));
    }
    Ok(ExternalName::Name(name.to_ascii_lowercase().into()))
}

/// The port requests to an ExternalName Service go to, as ingress-nginx picks it: the Service
/// port's numeric `targetPort`, else its `port`; without a matching Service port, the number the
/// route wrote. `None` for a named `targetPort` (nothing to resolve it against).
pub(crate) fn external_port(found: Option<&ServicePort>, written: Option<i32>) -> Option<i32> {
    match found {
        Some(port) => match &port.target_port {
            Some(IntOrString::Int(n)) if *n > 0 => Some(*n),
            Some(IntOrString::String(s)) => s.parse().ok().filter(|n| *n > 0),
            _ => Some(port.port),
        },
        None => written,
    }
    .filter(|n| (1..=65535).contains(n))
}

/// The names the plan's backends need looked up (IP literals need none).
pub fn wanted_names(plan: &RoutePlan) -> BTreeSet<Arc<str>> {
    plan.backends
        .values()
        .filter_map(|spec| spec.external_name.clone())
        .collect()
}

/// The one target of an ExternalName backend from the resolver's answer for its name: the first
/// address of each family (sorted, so an unchanged answer keeps the backend equal); forbidden
/// addresses are dropped and problems reported, both as diagnostics of the Service.
pub(super) fn external_target(
    spec: &BackendSpec,
    name: &str,
    resolved: Option<&Resolved>,
    allow_loopback: bool,
) -> (Vec<Target>, Vec<Diagnostic>) {
    let service = ObjectKey::new(Kind::Service, &*spec.service.namespace, &*spec.service.name);
    let mut diagnostics = Vec::new();
    let answer = resolved.and_then(|r| r.get(name));
    if let Some(problem) = answer.and_then(|a| a.problem.as_deref()) {
        diagnostics.push(Diagnostic::new(
            service.clone(),
            Reason::UnresolvedExternalName,
            format!("externalName {name}: {problem}"),
        ));
    }
    let port = u16::try_from(spec.port).unwrap_or_default();
    let mut target = Target::new(TargetId(format!("external/{name}").into()));
    let addrs = answer.into_iter().flat_map(|a| {
        let v4 = a.v4.iter().map(|ip| IpAddr::V4(*ip));
        v4.chain(a.v6.iter().map(|ip| IpAddr::V6(*ip)))
    });
    for ip in addrs {
        if let Some(class) = forbidden(ip, allow_loopback) {
            diagnostics.push(Diagnostic::new(
                service.clone(),
                Reason::ForbiddenEndpointAddress,
                format!("externalName {name} resolves to {ip}, which is {class}; duet does not proxy to it"),
            ));
            continue;
        }
        target.add_addr(SocketAddr::new(ip, port));
    }
    let targets = if target.has_addr() {
        vec![target]
    } else {
        Vec::new()
    };
    (targets, diagnostics)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::NsName;
    use dataplane::table::UpstreamProtocol;
    use k8s_openapi::api::core::v1::{Service, ServiceSpec};

    fn service(name: &str) -> Service {
        Service {
            spec: Some(ServiceSpec {
                type_: Some("ExternalName".into()),
                external_name: Some(name.into()),
                ..ServiceSpec::default()
            }),
            ..Service::default()
        }
    }

    fn spec() -> BackendSpec {
        BackendSpec {
            service: NsName::new("default", "db"),
            port_name: String::new(),
            port: 5432,
            protocol: UpstreamProtocol::Http1,
            cluster_ips: Vec::new(),
            external_name: Some("db.example.com".into()),
        }
    }

    #[test]
    fn names_and_literals_parse_and_garbage_is_refused() {
        let name = |s: &str| external_name(&service(s));
        assert_eq!(
            name("DB.Example.com."),
            Ok(ExternalName::Name("db.example.com".into()))
        );
        assert_eq!(
            name("2001:db8::7"),
            Ok(ExternalName::Ip("2001:db8::7".parse().unwrap()))
        );
        assert_eq!(
            name("::ffff:192.0.2.1"),
            Ok(ExternalName::Ip("192.0.2.1".parse().unwrap()))
        );
        for bad in ["", "a..b", "-a.b", "a b", "[::1]", "x/y", &"a".repeat(64)] {
            assert!(name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn one_target_holds_both_families_and_problems_are_reported() {
        let mut resolved = Resolved::new();
        resolved.insert(
            "db.example.com".into(),
            Resolution {
                v4: vec!["192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap()],
                v6: vec!["2001:db8::1".parse().unwrap()],
                problem: Some("lookup failed (timeout); serving the last answer".into()),
            },
        );
        let (targets, diagnostics) =
            external_target(&spec(), "db.example.com", Some(&resolved), false);
        assert_eq!(targets.len(), 1);
        assert_eq!(targets[0].v4, Some("192.0.2.1:5432".parse().unwrap()));
        assert_eq!(targets[0].v6, Some("[2001:db8::1]:5432".parse().unwrap()));
        assert_eq!(diagnostics.len(), 1);
        assert_eq!(diagnostics[0].reason, Reason::UnresolvedExternalName);

        // Not resolved yet: no target, nothing reported.
        let (targets, diagnostics) = external_target(&spec(), "db.example.com", None, false);
        assert!(targets.is_empty() && diagnostics.is_empty());
    }

    #[test]
    fn forbidden_answers_are_dropped() {
        let mut resolved = Resolved::new();
        resolved.insert(
            "db.example.com".into(),
            Resolution {
                v4: vec!["169.254.169.254".parse().unwrap()],
                v6: vec!["::1".parse().unwrap()],
                problem: None,
            },
        );
        let (targets, diagnostics) =
            external_target(&spec(), "db.example.com", Some(&resolved), false);
        assert!(targets.is_empty());
        assert_eq!(diagnostics.len(), 2);
        assert!(diagnostics
            .iter()
            .all(|d| d.reason == Reason::ForbiddenEndpointAddress));
    }

    #[test]
    fn the_port_is_the_numeric_target_port_else_the_port_else_the_route_s_number() {
        let port = |target: Option<IntOrString>| ServicePort {
            port: 80,
            target_port: target,
            ..ServicePort::default()
        };
        assert_eq!(
            external_port(Some(&port(Some(IntOrString::Int(8080)))), None),
            Some(8080)
        );
        assert_eq!(external_port(Some(&port(None)), None), Some(80));
        assert_eq!(
            external_port(Some(&port(Some(IntOrString::String("http".into())))), None),
            None
        );
        assert_eq!(external_port(None, Some(443)), Some(443));
        assert_eq!(external_port(None, Some(70000)), None);
    }
}
