//! What duet makes of a Gateway's listeners and of the Gateway as a whole: pure functions over
//! the spec, so the status a user sees is decided in one place and tested without a cluster.
//!
//! Supported protocols: `HTTP` and `HTTPS` (TLS terminated by duet), and `TLS` (TLSRoutes, by
//! SNI: `tls.mode: Passthrough` relays connections unterminated, `Terminate`, the default,
//! terminates TLS with the listener's certificates and relays the decrypted stream); anything else (`TCP`, `UDP`, or a name duet
//! does not know) is `Accepted=False` with reason `UnsupportedProtocol` and no `supportedKinds`.
//! Route kinds of `gateway.networking.k8s.io`: `HTTPRoute` and `GRPCRoute` on HTTP and HTTPS
//! listeners, `TLSRoute` on TLS listeners; a listener naming another kind in
//! `allowedRoutes.kinds` has `ResolvedRefs=False`, reason `InvalidRouteKinds`, and lists only the
//! kinds it supports.
//! Listeners on one port with different protocols are `Conflicted=True` (`ProtocolConflict`);
//! with the same protocol and hostname, `Conflicted=True` (`HostnameConflict`). TLS listeners of
//! both modes share a port: each connection's server name picks the listener, whose mode says
//! whether duet relays it unterminated or terminates it. An HTTPS listener must name
//! certificates (`certificateRefs`) of kind `Secret` in the core group.

use std::collections::BTreeMap;

use crate::gateway_api::conditions::Cond;
use crate::gateway_api::gateways::{GatewayListeners, GatewayListenersTlsMode, GatewaySpec};
use crate::gateway_api::GROUP;

/// The route kinds duet's HTTP and HTTPS listeners accept, in the order they are listed.
pub const ROUTE_KINDS: [&str; 2] = ["HTTPRoute", "GRPCRoute"];

/// The route kinds duet's TLS (passthrough) listeners accept.
pub const TLS_ROUTE_KINDS: [&str; 1] = ["TLSRoute"];

/// The route kinds a listener of `protocol` supports.
fn kinds_of(protocol: &str) -> &'static [&'static str] {
    if protocol == "TLS" {
        &TLS_ROUTE_KINDS
    } else {
        &ROUTE_KINDS
    }
}

/// Whether duet terminates TLS on a listener with its `certificateRefs`: `HTTPS`, and `TLS` in
/// mode `Terminate` (the default).
pub fn terminates(listener: &GatewayListeners) -> bool {
    listener.protocol == "HTTPS" || (listener.protocol == "TLS" && !is_passthrough(listener))
}

/// Whether a listener relays TLS unterminated (protocol `TLS`, mode `Passthrough`).
pub fn is_passthrough(listener: &GatewayListeners) -> bool {
    listener.protocol == "TLS"
        && listener.tls.as_ref().and_then(|t| t.mode.as_ref())
            == Some(&GatewayListenersTlsMode::Passthrough)
}

/// duet's verdict on one listener.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// The listener's name.
    pub name: String,
    /// Its port.
    pub port: i32,
    /// `supportedKinds` (group `gateway.networking.k8s.io`).
    pub kinds: Vec<&'static str>,
    /// `Accepted`, `Conflicted`, `ResolvedRefs` (Programmed is added with the addresses).
    pub accepted: Cond,
    /// `Conflicted`.
    pub conflicted: Cond,
    /// `ResolvedRefs`.
    pub resolved: Cond,
}

impl Verdict {
    /// Whether duet serves it: accepted, refs resolved, no conflict.
    pub fn valid(&self) -> bool {
        self.accepted.status && self.resolved.status && !self.conflicted.status
    }
}

fn supported_protocol(protocol: &str) -> bool {
    matches!(protocol, "HTTP" | "HTTPS" | "TLS")
}

/// The kinds a listener supports, and whether it named one duet does not.
fn route_kinds(listener: &GatewayListeners) -> (Vec<&'static str>, bool) {
    let supported = kinds_of(&listener.protocol);
    let asked = listener
        .allowed_routes
        .as_ref()
        .and_then(|a| a.kinds.as_ref());
    let Some(asked) = asked else {
        return (supported.to_vec(), false);
    };
    let mut kinds = Vec::new();
    let mut invalid = false;
    for k in asked {
        let group_ok = k.group.as_deref().is_none_or(|g| g == GROUP);
        match supported.iter().find(|s| **s == k.kind) {
            Some(kind) if group_ok => {
                if !kinds.contains(kind) {
                    kinds.push(*kind);
                }
            }
            _ => invalid = true,
        }
    }
    (kinds, invalid)
}

/// What is wrong with the TLS settings of a listener terminating TLS, if anything.
fn tls_problem(listener: &GatewayListeners) -> Option<String> {
    let Some(tls) = &listener.tls else {
        return Some(format!(
            "a {} listener needs tls.certificateRefs",
            listener.protocol
        ));
    };
    if listener.protocol == "HTTPS" && tls.mode == Some(GatewayListenersTlsMode::Passthrough) {
        return Some("tls.mode Passthrough is not supported on HTTPS listeners".to_owned());
    }
    let refs = tls.certificate_refs.as_deref().unwrap_or_default();
    if refs.is_empty() {
        return Some(format!(
            "a {} listener needs tls.certificateRefs",
            listener.protocol
        ));
    }
    refs.iter().find_map(|r| {
        let group = r.group.as_deref().unwrap_or("");
        let kind = r.kind.as_deref().unwrap_or("Secret");
        (!group.is_empty() || kind != "Secret").then(|| {
            format!(
                "certificateRef {} is a {kind} of group {group:?}; only core Secrets are supported",
                r.name
            )
        })
    })
}

/// The listeners' verdicts, in spec order.
pub fn check(spec: &GatewaySpec) -> Vec<Verdict> {
    let conflicts = conflicts(&spec.listeners);
    spec.listeners
        .iter()
        .zip(conflicts)
        .map(|(l, conflict)| verdict(l, conflict))
        .collect()
}

/// A listener's conflict with others of its port: `Conflicted=True` with its reason.
type Conflict = Cond;

fn verdict(l: &GatewayListeners, conflict: Option<Conflict>) -> Verdict {
    let supported = supported_protocol(&l.protocol);
    let (kinds, invalid_kinds) = if supported {
        route_kinds(l)
    } else {
        (Vec::new(), false)
    };
    let accepted = if supported {
        Cond::yes("Accepted", "Accepted", "")
    } else {
        Cond::no(
            "Accepted",
            "UnsupportedProtocol",
            format!(
                "protocol {:?} is not supported; duet serves HTTP, HTTPS and TLS",
                l.protocol
            ),
        )
    };
    let tls = terminates(l).then(|| tls_problem(l)).flatten();
    let resolved = if invalid_kinds {
        Cond::no(
            "ResolvedRefs",
            "InvalidRouteKinds",
            format!(
                "allowedRoutes.kinds names a kind other than {:?}",
                kinds_of(&l.protocol)
            ),
        )
    } else if let Some(problem) = tls {
        Cond::no("ResolvedRefs", "InvalidCertificateRef", problem)
    } else {
        Cond::yes("ResolvedRefs", "ResolvedRefs", "")
    };
    Verdict {
        name: l.name.clone(),
        port: l.port,
        kinds,
        accepted,
        conflicted: conflict.unwrap_or_else(|| Cond::no("Conflicted", "NoConflicts", "")),
        resolved,
    }
}

/// Per listener, its conflict if any: different protocols on one port, or the same protocol and
/// hostname twice on one port (TLS listeners of both modes share a port).
fn conflicts(listeners: &[GatewayListeners]) -> Vec<Option<Conflict>> {
    let mut by_port: BTreeMap<i32, Vec<usize>> = BTreeMap::new();
    for (i, l) in listeners.iter().enumerate() {
        by_port.entry(l.port).or_default().push(i);
    }
    let mut out = vec![None; listeners.len()];
    for (port, members) in by_port {
        let first = &listeners[members[0]].protocol;
        if members.iter().any(|&i| listeners[i].protocol != *first) {
            let message = format!("listeners on port {port} ask for different protocols");
            for &i in &members {
                out[i] = Some(Cond::yes("Conflicted", "ProtocolConflict", message.clone()));
            }
            continue;
        }
        for &i in &members {
            let host = listeners[i].hostname.as_deref().unwrap_or("");
            let twice = members
                .iter()
                .filter(|&&j| listeners[j].hostname.as_deref().unwrap_or("") == host)
                .count()
                > 1;
            if twice {
                let cond = Cond::yes(
                    "Conflicted",
                    "HostnameConflict",
                    format!("another listener on port {port} has hostname {host:?}"),
                );
                out[i] = Some(cond);
            }
        }
    }
    out
}

/// The Gateway's `Accepted` condition, from its spec and its listeners' verdicts.
pub fn gateway_accepted(spec: &GatewaySpec, verdicts: &[Verdict]) -> Cond {
    if let Some(p) = spec
        .infrastructure
        .as_ref()
        .and_then(|i| i.parameters_ref.as_ref())
    {
        return Cond::no(
            "Accepted",
            "InvalidParameters",
            format!(
                "infrastructure.parametersRef {}/{} {}: duet supports no parameters",
                p.group, p.kind, p.name
            ),
        );
    }
    if let Err(why) = requested_addresses(spec) {
        return Cond::no("Accepted", "UnsupportedAddress", why);
    }
    let valid = verdicts.iter().filter(|v| v.valid()).count();
    match valid {
        n if n == verdicts.len() => Cond::yes("Accepted", "Accepted", ""),
        0 => Cond::no("Accepted", "ListenersNotValid", "no listener is valid"),
        n => Cond::yes(
            "Accepted",
            "ListenersNotValid",
            format!(
                "{} of {} listeners are not valid",
                verdicts.len() - n,
                verdicts.len()
            ),
        ),
    }
}

/// The addresses `spec.addresses` asks the load balancer for, in the spec's order: entries of
/// type `IPAddress` (the default type) with a value. An `IPAddress` entry without a value asks
/// for whatever address the load balancer gives (nothing to request). Any other type
/// (`Hostname`, `NamedAddress`, a vendor's) or a value that is not an IP address is refused:
/// duet's Service can only ask for IP addresses.
pub fn requested_addresses(spec: &GatewaySpec) -> Result<Vec<std::net::IpAddr>, String> {
    let mut out = Vec::new();
    for a in spec.addresses.iter().flatten() {
        let kind = a.r#type.as_deref().unwrap_or("IPAddress");
        if kind != "IPAddress" {
            return Err(format!(
                "address type {kind:?} is not supported: duet asks the load balancer for IP \
                 addresses (type IPAddress)"
            ));
        }
        let Some(value) = a.value.as_deref().filter(|v| !v.is_empty()) else {
            continue;
        };
        let ip = value
            .parse()
            .map_err(|_| format!("address {value:?} is not an IP address"))?;
        out.push(ip);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> GatewaySpec {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn unsupported_protocols_and_route_kinds_are_reported_per_listener() {
        let s = spec(
            r#"
gatewayClassName: duet
listeners:
  - {name: http, port: 80, protocol: HTTP}
  - {name: bad, port: 1111, protocol: INVALID}
  - {name: kinds, port: 81, protocol: HTTP, allowedRoutes: {kinds: [{kind: HTTPRoute}, {kind: InvalidRoute}]}}
  - {name: nokinds, port: 82, protocol: HTTP, allowedRoutes: {kinds: [{kind: InvalidRoute}]}}
  - {name: othergroup, port: 83, protocol: HTTP, allowedRoutes: {kinds: [{group: example.com, kind: HTTPRoute}]}}
"#,
        );
        let v = check(&s);
        assert!(v[0].valid());
        assert_eq!(v[0].kinds, ROUTE_KINDS);
        assert!(!v[1].accepted.status);
        assert_eq!(v[1].accepted.reason, "UnsupportedProtocol");
        assert!(v[1].kinds.is_empty());
        assert_eq!(v[2].kinds, ["HTTPRoute"]);
        assert_eq!(v[2].resolved.reason, "InvalidRouteKinds");
        assert!(v[3].kinds.is_empty());
        assert_eq!(v[3].resolved.reason, "InvalidRouteKinds");
        assert_eq!(v[4].resolved.reason, "InvalidRouteKinds");
        let accepted = gateway_accepted(&s, &v);
        assert!(accepted.status);
        assert_eq!(accepted.reason, "ListenersNotValid");
        let only_bad =
            spec("gatewayClassName: duet\nlisteners: [{name: bad, port: 1111, protocol: INVALID}]");
        let accepted = gateway_accepted(&only_bad, &check(&only_bad));
        assert_eq!(
            (accepted.status, accepted.reason),
            (false, "ListenersNotValid")
        );
    }

    #[test]
    fn tls_listeners_take_tlsroutes_and_terminating_ones_need_certificates() {
        let s = spec(
            r#"
gatewayClassName: duet
listeners:
  - {name: pass, port: 443, protocol: TLS, tls: {mode: Passthrough}}
  - {name: term, port: 8443, protocol: TLS, tls: {mode: Terminate, certificateRefs: [{name: c}]}}
  - {name: default, port: 8444, protocol: TLS}
  - {name: kinds, port: 8445, protocol: TLS, tls: {mode: Passthrough}, allowedRoutes: {kinds: [{kind: TCPRoute}, {kind: TLSRoute}]}}
  - {name: http, port: 80, protocol: HTTP, allowedRoutes: {kinds: [{kind: TLSRoute}]}}
  - {name: mixed, port: 443, protocol: HTTPS, tls: {certificateRefs: [{name: c}]}}
"#,
        );
        let v = check(&s);
        assert_eq!(v[0].kinds, TLS_ROUTE_KINDS);
        assert!(v[0].accepted.status, "{:?}", v[0]);
        // Terminate (named or by default) with certificates; without, InvalidCertificateRef.
        assert!(v[1].valid(), "{:?}", v[1]);
        assert_eq!(v[1].kinds, TLS_ROUTE_KINDS);
        assert!(v[2].accepted.status);
        assert_eq!(v[2].resolved.reason, "InvalidCertificateRef");
        assert_eq!(v[3].kinds, ["TLSRoute"]);
        assert_eq!(v[3].resolved.reason, "InvalidRouteKinds");
        // An HTTP listener does not take TLSRoutes.
        assert!(v[4].kinds.is_empty());
        assert_eq!(v[4].resolved.reason, "InvalidRouteKinds");
        // TLS and HTTPS on one port conflict.
        assert_eq!(v[0].conflicted.reason, "ProtocolConflict");
        assert_eq!(v[5].conflicted.reason, "ProtocolConflict");
        // TLS listeners of both modes share a port: both accepted, with their kinds; the same
        // hostname twice on that port still conflicts.
        let mixed = spec(
            r#"
gatewayClassName: duet
listeners:
  - {name: term, port: 8883, protocol: TLS, hostname: a.test, tls: {mode: Terminate, certificateRefs: [{name: c}]}}
  - {name: pass, port: 8883, protocol: TLS, hostname: b.test, tls: {mode: Passthrough}}
  - {name: other, port: 8884, protocol: TLS, tls: {mode: Passthrough}}
  - {name: twice, port: 8883, protocol: TLS, hostname: b.test, tls: {mode: Terminate, certificateRefs: [{name: c}]}}
"#,
        );
        let v = check(&mixed);
        assert!(v[0].valid(), "{:?}", v[0]);
        assert_eq!(v[0].kinds, TLS_ROUTE_KINDS);
        assert!(v[0].accepted.status && v[1].accepted.status, "{v:?}");
        assert_eq!(v[1].kinds, TLS_ROUTE_KINDS);
        assert_eq!(v[1].conflicted.reason, "HostnameConflict");
        assert_eq!(v[3].conflicted.reason, "HostnameConflict");
        assert!(v[2].valid(), "{:?}", v[2]);
    }

    #[test]
    fn conflicts_tls_and_parameters() {
        let s = spec(
            r#"
gatewayClassName: duet
listeners:
  - {name: a, port: 80, protocol: HTTP}
  - {name: b, port: 80, protocol: HTTP, hostname: b.test}
  - {name: c, port: 80, protocol: HTTP, hostname: b.test}
  - {name: d, port: 443, protocol: HTTPS, tls: {certificateRefs: [{name: cert}]}}
  - {name: e, port: 443, protocol: HTTP}
  - {name: f, port: 8443, protocol: HTTPS}
  - {name: g, port: 9443, protocol: HTTPS, tls: {certificateRefs: [{group: example.com, kind: Cert, name: x}]}}
  - {name: h, port: 9444, protocol: HTTPS, tls: {certificateRefs: [{kind: Secret, name: x}]}}
"#,
        );
        let v = check(&s);
        assert!(v[0].valid(), "{:?}", v[0]);
        assert_eq!(v[1].conflicted.reason, "HostnameConflict");
        assert_eq!(v[2].conflicted.reason, "HostnameConflict");
        assert_eq!(v[3].conflicted.reason, "ProtocolConflict");
        assert_eq!(v[4].conflicted.reason, "ProtocolConflict");
        assert_eq!(v[5].resolved.reason, "InvalidCertificateRef");
        assert_eq!(v[6].resolved.reason, "InvalidCertificateRef");
        assert!(v[7].valid(), "{:?}", v[7]);
        let with_params = spec("gatewayClassName: duet\ninfrastructure: {parametersRef: {group: invalid.io, kind: InvalidParameters, name: x}}\nlisteners: [{name: a, port: 80, protocol: HTTP}]");
        let accepted = gateway_accepted(&with_params, &check(&with_params));
        assert_eq!(
            (accepted.status, accepted.reason),
            (false, "InvalidParameters")
        );
    }

    #[test]
    fn ip_addresses_of_both_families_are_requested_and_other_types_refused() {
        let listeners = "listeners: [{name: a, port: 80, protocol: HTTP}]";
        let with = |addresses: &str| {
            spec(&format!(
                "gatewayClassName: duet\naddresses: {addresses}\n{listeners}"
            ))
        };
        let both =
            with("[{value: 10.0.0.1}, {type: IPAddress, value: 'fd00::1'}, {type: IPAddress}]");
        let accepted = gateway_accepted(&both, &check(&both));
        assert_eq!((accepted.status, accepted.reason), (true, "Accepted"));
        let ips: Vec<String> = requested_addresses(&both)
            .unwrap()
            .iter()
            .map(|i| i.to_string())
            .collect();
        assert_eq!(
            ips,
            ["10.0.0.1", "fd00::1"],
            "the spec's order; a value-less entry asks nothing"
        );
        for refused in [
            "[{type: Hostname, value: gw.example.com}]",
            "[{type: test/fake-invalid-type, value: x}]",
            "[{value: 'not an ip'}]",
        ] {
            let gw = with(refused);
            let accepted = gateway_accepted(&gw, &check(&gw));
            assert_eq!(
                (accepted.status, accepted.reason),
                (false, "UnsupportedAddress"),
                "{refused}"
            );
        }
    }
}
