//! What translation could not use, and why: one entry per skipped or questionable part of an
//! object. Logged, shown on `/debug/routes`, later written as Events and status conditions.

use std::fmt;

use serde::Serialize;

use crate::object::ObjectKey;

/// The type of a Kubernetes Event (`Normal` or `Warning`), without the Kubernetes client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    /// Informational.
    Normal,
    /// Something to act on.
    Warning,
}

impl EventType {
    /// The Event's `type` as the API writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// Why part of an object was skipped or overridden.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Reason {
    /// A backend names a Service that does not exist; the rule is skipped.
    MissingService,
    /// A backend names a port (number or name) the Service does not have; the rule is skipped.
    UnknownServicePort,
    /// A TLS entry names a Secret that does not exist.
    MissingSecret,
    /// Another rule of higher precedence claims the same host, match type and path; this one
    /// is ignored.
    ConflictingPath,
    /// A path that does not start with `/`, or an unknown `pathType`; the path is skipped.
    InvalidPath,
    /// A host that is not a DNS name or a `*.` wildcard; the rule is skipped.
    InvalidHost,
    /// An annotation value duet does not understand; its default applies.
    InvalidAnnotation,
    /// An older Ingress already provides the default backend; this one is ignored.
    DuplicateDefaultBackend,
    /// A backend kind duet does not serve (`resource` backends, an ExternalName Service whose
    /// `externalName` is neither a DNS name nor an IP address).
    UnsupportedBackend,
    /// An EndpointSlice whose `addressType` is not `IPv4` or `IPv6` (e.g. `FQDN`); skipped.
    UnsupportedAddressType,
    /// An endpoint address that does not parse or does not match its slice's address type.
    InvalidEndpoint,
    /// An EndpointSlice of a used Service has no port named like the Service port.
    UnknownEndpointPort,
    /// A TLS Secret that is not `kubernetes.io/tls`, lacks `tls.crt`/`tls.key`, does not parse,
    /// or whose key does not match its certificate; its hosts get the default certificate.
    InvalidCertificate,
    /// A TLS certificate that does not cover a host listed with it; that host gets the default
    /// certificate.
    CertificateHostMismatch,
    /// A Service port whose `appProtocol` duet does not know; it is served as HTTP/1.1.
    UnsupportedAppProtocol,
    /// The TLS settings for a TLS upstream (`https`, `h2`) cannot be built (a CA Secret without a
    /// usable `ca.crt`); the Ingress's routes to it answer 502.
    InvalidBackendTls,
    /// Upstream certificates are not verified (`duet.dev/backend-tls-skip-verify: "true"`).
    InsecureBackendTls,
    /// An endpoint address duet never proxies to (loopback outside `--manifests` mode,
    /// unspecified, link-local, multicast or broadcast); the endpoint is dropped.
    ForbiddenEndpointAddress,
    /// An `nginx.ingress.kubernetes.io/` annotation duet does not apply (unsupported, unknown or
    /// removed upstream); the Ingress is served without it.
    IgnoredAnnotation,
    /// A snippet annotation (raw nginx configuration): never interpreted; the Ingress is served
    /// without it, or not at all under `--strict-annotations`.
    SnippetAnnotation,
    /// An ExternalName Service's name does not resolve (NXDOMAIN, no A/AAAA records: no target)
    /// or its lookup failed (the last good answer is served).
    UnresolvedExternalName,
}

impl Reason {
    /// Every reason, in declaration order.
    pub const ALL: [Reason; 21] = [
        Reason::MissingService,
        Reason::UnknownServicePort,
        Reason::MissingSecret,
        Reason::ConflictingPath,
        Reason::InvalidPath,
        Reason::InvalidHost,
        Reason::InvalidAnnotation,
        Reason::DuplicateDefaultBackend,
        Reason::UnsupportedBackend,
        Reason::UnsupportedAddressType,
        Reason::InvalidEndpoint,
        Reason::UnknownEndpointPort,
        Reason::InvalidCertificate,
        Reason::CertificateHostMismatch,
        Reason::UnsupportedAppProtocol,
        Reason::InvalidBackendTls,
        Reason::InsecureBackendTls,
        Reason::ForbiddenEndpointAddress,
        Reason::IgnoredAnnotation,
        Reason::SnippetAnnotation,
        Reason::UnresolvedExternalName,
    ];

    /// What the reason means and what duet did (the reference's "what it means").
    pub fn meaning(self) -> &'static str {
        match self {
            Reason::MissingService => "A backend names a Service that does not exist; the rule is skipped.",
            Reason::UnknownServicePort => "A backend names a port (number or name) the Service does not have; the rule is skipped.",
            Reason::MissingSecret => "A TLS entry (or `duet.dev/backend-ca-secret`, or an auth annotation) names a Secret that does not exist.",
            Reason::ConflictingPath => "Another rule of higher precedence claims the same host, match type and path; this one is ignored.",
            Reason::InvalidPath => "A path that does not start with `/`, or an unknown `pathType`; the path is skipped.",
            Reason::InvalidHost => "A host that is not a DNS name or a `*.` wildcard; the rule is skipped.",
            Reason::InvalidAnnotation => "An annotation value duet does not understand; its default applies.",
            Reason::DuplicateDefaultBackend => "An older Ingress already provides the default backend; this one is ignored.",
            Reason::UnsupportedBackend => "A backend kind duet does not serve (`resource` backends, an ExternalName Service whose `externalName` is neither a DNS name nor an IP address).",
            Reason::UnsupportedAddressType => "An EndpointSlice whose `addressType` is not `IPv4` or `IPv6` (e.g. `FQDN`); skipped.",
            Reason::InvalidEndpoint => "An endpoint address that does not parse or does not match its slice's address type.",
            Reason::UnknownEndpointPort => "An EndpointSlice of a used Service has no port named like the Service port.",
            Reason::InvalidCertificate => "A TLS Secret that is not `kubernetes.io/tls`, lacks `tls.crt`/`tls.key`, does not parse, or whose key does not match its certificate; its hosts get the default certificate.",
            Reason::CertificateHostMismatch => "A TLS certificate that does not cover a host listed with it; that host gets the default certificate.",
            Reason::UnsupportedAppProtocol => "A Service port whose `appProtocol` duet does not know; it is served as HTTP/1.1.",
            Reason::InvalidBackendTls => "The TLS settings for a TLS upstream (`https`, `h2`) cannot be built (a CA Secret without a usable `ca.crt`); the Ingress's routes to it answer 502.",
            Reason::InsecureBackendTls => "Upstream certificates are not verified (`duet.dev/backend-tls-skip-verify: \"true\"`).",
            Reason::ForbiddenEndpointAddress => "An endpoint address duet never proxies to (loopback outside `--manifests` mode, unspecified, link-local, multicast or broadcast); the endpoint is dropped.",
            Reason::IgnoredAnnotation => "An `nginx.ingress.kubernetes.io/` annotation duet does not apply (unsupported, unknown or removed upstream); the Ingress is served without it.",
            Reason::SnippetAnnotation => "A snippet annotation (raw nginx configuration): never interpreted; the Ingress is served without it, or not at all under `--strict-annotations`.",
            Reason::UnresolvedExternalName => "An ExternalName Service's name does not resolve (NXDOMAIN, no A/AAAA records: no target) or its lookup failed (the last good answer is served).",
        }
    }

    /// How to fix the object (the reference's "how to fix it").
    pub fn fix(self) -> &'static str {
        match self {
            Reason::MissingService => "Create the Service in the Ingress's namespace, or correct `service.name` in the backend.",
            Reason::UnknownServicePort => "Use a `port.number` or `port.name` listed in the Service's `spec.ports`.",
            Reason::MissingSecret => "Create the Secret in the Ingress's namespace, or correct the name the Ingress gives.",
            Reason::ConflictingPath => "Remove the duplicate rule, or give it another host or path. The older Ingress (creationTimestamp, then namespace/name) keeps the path.",
            Reason::InvalidPath => "Start the path with `/` and use `pathType` `Exact`, `Prefix` or `ImplementationSpecific`.",
            Reason::InvalidHost => "Write the host as a lower-case DNS name (`shop.example.com`) or a one-label wildcard (`*.example.com`), without port or address.",
            Reason::InvalidAnnotation => "Correct the value: the message names the annotation, what is wrong, and what applies instead (see the annotation reference).",
            Reason::DuplicateDefaultBackend => "Keep `defaultBackend` on one Ingress of the class only.",
            Reason::UnsupportedBackend => "Point the backend at a Service; give an ExternalName Service a DNS name or an IP address.",
            Reason::UnsupportedAddressType => "Use a Service with a selector, or write EndpointSlices of address type `IPv4` and `IPv6`; for a DNS name use an ExternalName Service.",
            Reason::InvalidEndpoint => "Correct the EndpointSlice: IPv4 addresses in `IPv4` slices, IPv6 addresses in `IPv6` slices.",
            Reason::UnknownEndpointPort => "Name the EndpointSlice's ports as the Service's ports (`spec.ports[].name`); a selector-less Service's slices must repeat the names.",
            Reason::InvalidCertificate => "Recreate the Secret with `kubectl create secret tls NAME --cert=CHAIN.pem --key=KEY.pem` (PEM chain, leaf first, and its key).",
            Reason::CertificateHostMismatch => "Issue the certificate with the host in its subject alternative names, or list the host under a TLS entry whose certificate covers it.",
            Reason::UnsupportedAppProtocol => "Set `appProtocol` to one of `http`, `https`, `h2c`, `h2`, `grpc`, `grpcs`, `kubernetes.io/h2c`, `kubernetes.io/ws`, `kubernetes.io/wss`, `ws`, `wss`, or remove it.",
            Reason::InvalidBackendTls => "Put a PEM CA bundle under the key `ca.crt` of the Secret named by `duet.dev/backend-ca-secret`.",
            Reason::InsecureBackendTls => "Name the upstream's CA with `duet.dev/backend-ca-secret` and remove `duet.dev/backend-tls-skip-verify`; keep it only where the upstream's identity does not matter.",
            Reason::ForbiddenEndpointAddress => "Give the endpoint a pod or node address; loopback is allowed only with `--allow-loopback-endpoints` (tests).",
            Reason::IgnoredAnnotation => "Check the message and the ingress-nginx annotation reference: remove the annotation, correct a misspelt key, or use the duet equivalent named there. `duet migrate check` lists them all.",
            Reason::SnippetAnnotation => "Express the snippet's effect with supported annotations (see the ingress-nginx annotation reference), then remove it.",
            Reason::UnresolvedExternalName => "Check the name in `spec.externalName` and the name servers of `--resolv-conf` (`dig A NAME`, `dig AAAA NAME`).",
        }
    }

    /// The type of the Kubernetes Event recorded for it: every diagnostic is a `Warning`.
    pub fn event_type(self) -> EventType {
        EventType::Warning
    }

    /// The reason's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::MissingService => "MissingService",
            Reason::UnknownServicePort => "UnknownServicePort",
            Reason::MissingSecret => "MissingSecret",
            Reason::ConflictingPath => "ConflictingPath",
            Reason::InvalidPath => "InvalidPath",
            Reason::InvalidHost => "InvalidHost",
            Reason::InvalidAnnotation => "InvalidAnnotation",
            Reason::DuplicateDefaultBackend => "DuplicateDefaultBackend",
            Reason::UnsupportedBackend => "UnsupportedBackend",
            Reason::UnsupportedAddressType => "UnsupportedAddressType",
            Reason::InvalidEndpoint => "InvalidEndpoint",
            Reason::UnknownEndpointPort => "UnknownEndpointPort",
            Reason::InvalidCertificate => "InvalidCertificate",
            Reason::CertificateHostMismatch => "CertificateHostMismatch",
            Reason::UnsupportedAppProtocol => "UnsupportedAppProtocol",
            Reason::InvalidBackendTls => "InvalidBackendTls",
            Reason::InsecureBackendTls => "InsecureBackendTls",
            Reason::ForbiddenEndpointAddress => "ForbiddenEndpointAddress",
            Reason::IgnoredAnnotation => "IgnoredAnnotation",
            Reason::SnippetAnnotation => "SnippetAnnotation",
            Reason::UnresolvedExternalName => "UnresolvedExternalName",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One problem found while translating, tied to the object that has it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Diagnostic {
    /// The object with the problem.
    pub object: ObjectKey,
    /// The kind of problem.
    pub reason: Reason,
    /// What exactly, and what duet did about it.
    pub message: String,
}

impl Diagnostic {
    /// A diagnostic from its parts.
    pub fn new(object: ObjectKey, reason: Reason, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            object,
            reason,
            message: message.into(),
        }
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.object, self.reason, self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::Kind;

    #[test]
    fn display_names_object_reason_and_message() {
        let d = Diagnostic::new(
            ObjectKey::new(Kind::Ingress, "shop", "web"),
            Reason::MissingService,
            "service shop/api does not exist; rule skipped",
        );
        assert_eq!(
            d.to_string(),
            "Ingress shop/web: MissingService: service shop/api does not exist; rule skipped"
        );
    }
}
