//! What translation could not use, and why: one entry per skipped or questionable part of an
//! object. Logged, shown on `/debug/routes`, later written as Events and status conditions.

use std::fmt;

use serde::Serialize;

use crate::object::ObjectKey;

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
