//! Per-Ingress upstream timeouts: `duet.dev/proxy-connect-timeout` and
//! `duet.dev/proxy-read-timeout`, durations like ingress-nginx accepts (`5s`, `500ms`, `2m`, or a
//! bare number of seconds). An invalid value is an `InvalidAnnotation` diagnostic and the global
//! flag applies; the Ingress is still served.

use dataplane::table::UpstreamTimeouts;

use super::annotation::{annotation, Annotated};
use super::diagnostic::Diagnostic;
use crate::units::parse_duration;

/// The per-Ingress annotation overriding `--connect-timeout`.
pub const CONNECT_TIMEOUT_ANNOTATION: &str = super::annotation::PROXY_CONNECT_TIMEOUT.name;

/// The per-Ingress annotation overriding `--upstream-timeout` (response head and between body
/// reads).
pub const READ_TIMEOUT_ANNOTATION: &str = super::annotation::PROXY_READ_TIMEOUT.name;

/// The upstream timeouts an object sets; invalid values are reported and left to the globals.
pub(crate) fn upstream_timeouts(
    obj: &Annotated<'_>,
    diagnostics: &mut Vec<Diagnostic>,
) -> UpstreamTimeouts {
    let mut read = |name: &str, flag: &str| {
        let parse = |v: &str| parse_duration(v).map(Some);
        annotation(
            obj,
            name,
            parse,
            (None, format_args!("using {flag}")),
            diagnostics,
        )
    };
    UpstreamTimeouts {
        connect: read(CONNECT_TIMEOUT_ANNOTATION, "--connect-timeout"),
        read: read(READ_TIMEOUT_ANNOTATION, "--upstream-timeout"),
        send: None,
    }
}
