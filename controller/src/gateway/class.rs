//! GatewayClasses: those whose `spec.controllerName` is ours (`--gateway-controller-name`) get
//! `Accepted` and `supportedFeatures`; others are never touched.
//!
//! `supportedFeatures` lists the conformance features duet passes on both family runs of the
//! upstream suite (README, "Gateway API conformance"), sorted: the core features of GATEWAY-HTTP,
//! GATEWAY-GRPC, GATEWAY-TLS and the extended ones of `conformance/gateway/options.go`.

use k8s_openapi::jiff::Timestamp;

use crate::gateway_api::conditions::{dated, Cond};
use crate::gateway_api::gatewayclasses::{
    GatewayClass, GatewayClassStatus, GatewayClassStatusSupportedFeatures,
};
pub use crate::gateway_api::is_ours;

/// The conformance features duet passes (see the module documentation).
pub const SUPPORTED_FEATURES: &[&str] = &[
    "BackendTLSPolicy",
    "BackendTLSPolicySANValidation",
    "GRPCRoute",
    "Gateway",
    "GatewayAddressEmpty",
    "GatewayBackendClientCertificate",
    "GatewayFrontendClientCertificateValidation",
    "GatewayFrontendClientCertificateValidationInsecureFallback",
    "GatewayHTTPListenerIsolation",
    "GatewayHTTPSListenerDetectMisdirectedRequests",
    "GatewayInfrastructure",
    "GatewayPort8080",
    "GatewayStaticAddresses",
    "HTTPRoute",
    "HTTPRoute303RedirectStatusCode",
    "HTTPRoute307RedirectStatusCode",
    "HTTPRoute308RedirectStatusCode",
    "HTTPRouteBackendProtocolH2C",
    "HTTPRouteBackendProtocolWebSocket",
    "HTTPRouteBackendRequestHeaderModification",
    "HTTPRouteBackendTimeout",
    "HTTPRouteCORS",
    "HTTPRouteDestinationPortMatching",
    "HTTPRouteHostRewrite",
    "HTTPRouteMethodMatching",
    "HTTPRouteNamedRouteRule",
    "HTTPRouteParentRefPort",
    "HTTPRoutePathRedirect",
    "HTTPRoutePathRewrite",
    "HTTPRoutePortRedirect",
    "HTTPRouteQueryParamMatching",
    "HTTPRouteRequestMirror",
    "HTTPRouteRequestMultipleMirrors",
    "HTTPRouteRequestPercentageMirror",
    "HTTPRouteRequestTimeout",
    "HTTPRouteResponseHeaderModification",
    "HTTPRouteRetry",
    "HTTPRouteSchemeRedirect",
    "ListenerSet",
    "ReferenceGrant",
    "TLSRoute",
    "TLSRouteModeMixed",
    "TLSRouteModeTerminate",
];

/// The `Accepted` condition: duet takes no parameters, so a class naming some is refused.
fn accepted(class: &GatewayClass) -> Cond {
    match &class.spec.parameters_ref {
        Some(p) => Cond::no(
            "Accepted",
            "InvalidParameters",
            format!(
                "parametersRef {}/{} {}: duet supports no parameters",
                p.group, p.kind, p.name
            ),
        ),
        None => Cond::yes("Accepted", "Accepted", "duet serves this class"),
    }
}

/// The status duet writes on one of its classes, keeping transition times of `class.status`.
pub fn status(class: &GatewayClass, now: Timestamp) -> GatewayClassStatus {
    let old = class
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    GatewayClassStatus {
        conditions: Some(dated(
            &[accepted(class)],
            class.metadata.generation,
            &old,
            now,
        )),
        supported_features: Some(
            SUPPORTED_FEATURES
                .iter()
                .map(|f| GatewayClassStatusSupportedFeatures {
                    name: (*f).to_owned(),
                })
                .collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(yaml: &str) -> GatewayClass {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn accepted_with_generation_unless_it_names_parameters() {
        let c = class("apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: duet, generation: 3}\nspec: {controllerName: duet.dev/gateway-controller}");
        assert!(is_ours(&c, "duet.dev/gateway-controller"));
        assert!(!is_ours(&c, "example.com/other"));
        let s = status(&c, Timestamp::now());
        let cond = &s.conditions.unwrap()[0];
        assert_eq!(
            (cond.type_.as_str(), cond.status.as_str()),
            ("Accepted", "True")
        );
        assert_eq!(cond.observed_generation, Some(3));
        let names: Vec<String> = s
            .supported_features
            .unwrap()
            .into_iter()
            .map(|f| f.name)
            .collect();
        assert!(names.is_sorted(), "{names:?}");
        assert_eq!(names.len(), SUPPORTED_FEATURES.len(), "{names:?}");
        assert!(names.iter().any(|n| n == "ListenerSet"));
        assert!(names.iter().any(|n| n == "HTTPRouteQueryParamMatching"));
        assert!(names.iter().any(|n| n == "HTTPRouteCORS"));
        assert!(names.iter().any(|n| n == "HTTPRouteRequestMirror"));
        assert!(names
            .iter()
            .any(|n| n == "GatewayFrontendClientCertificateValidationInsecureFallback"));
        let p = class("apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: duet}\nspec: {controllerName: duet.dev/gateway-controller, parametersRef: {group: example.com, kind: P, name: p}}");
        let cond = &status(&p, Timestamp::now()).conditions.unwrap()[0];
        assert_eq!(
            (cond.status.as_str(), cond.reason.as_str()),
            ("False", "InvalidParameters")
        );
    }
}
