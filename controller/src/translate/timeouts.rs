//! Per-Ingress upstream timeouts: `duet.dev/proxy-connect-timeout` and
//! `duet.dev/proxy-read-timeout`, durations like ingress-nginx accepts (`5s`, `500ms`, `2m`, or a
//! bare number of seconds). An invalid value is an `InvalidAnnotation` diagnostic and the global
//! flag applies; the Ingress is still served.

use dataplane::table::UpstreamTimeouts;
use k8s_openapi::api::networking::v1::Ingress;

use super::diagnostic::{Diagnostic, Reason};
use crate::config::parse_duration;
use crate::index::ObjectKey;

/// The per-Ingress annotation overriding `--connect-timeout`.
pub const CONNECT_TIMEOUT_ANNOTATION: &str = "duet.dev/proxy-connect-timeout";

/// The per-Ingress annotation overriding `--upstream-timeout` (response head and between body
/// reads).
pub const READ_TIMEOUT_ANNOTATION: &str = "duet.dev/proxy-read-timeout";

/// The upstream timeouts an Ingress sets; invalid values are reported and left to the globals.
pub fn upstream_timeouts(
    key: &ObjectKey,
    ingress: &Ingress,
    diagnostics: &mut Vec<Diagnostic>,
) -> UpstreamTimeouts {
    let annotations = ingress.metadata.annotations.as_ref();
    let mut read = |name: &str, flag: &str| {
        let value = annotations.and_then(|a| a.get(name))?;
        match parse_duration(value) {
            Ok(duration) => Some(duration),
            Err(error) => {
                diagnostics.push(Diagnostic::new(
                    key.clone(),
                    Reason::InvalidAnnotation,
                    format!("{name}: {error}; using {flag}"),
                ));
                None
            }
        }
    };
    UpstreamTimeouts {
        connect: read(CONNECT_TIMEOUT_ANNOTATION, "--connect-timeout"),
        read: read(READ_TIMEOUT_ANNOTATION, "--upstream-timeout"),
        send: None,
    }
}
