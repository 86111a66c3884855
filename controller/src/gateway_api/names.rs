//! The names duet gives the objects it manages for a Gateway, and the listener ports read back
//! from the Service it manages: shared by translation (which serves those ports) and the
//! Gateway controller (which writes the Service).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ServicePort;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// The Service's name: `duet-NAME` when that is a DNS label, else a cut name with a hash of the
/// whole name (Gateway names may be 253 characters and hold dots; Service names may not).
pub fn service_name(gateway: &str) -> String {
    let plain = format!("duet-{gateway}");
    if crate::object::is_dns_label(&plain) {
        return plain;
    }
    let cut: String = gateway
        .chars()
        .map(|c| if c == '.' { '-' } else { c })
        .take(40)
        .collect();
    format!("duet-{}-{:08x}", cut.trim_end_matches('-'), fnv(gateway))
}

/// The name of a Service port for a listener port.
pub fn port_name(listener_port: u16) -> String {
    format!("port-{listener_port}")
}

/// [`held_ports`] of a Service's ports.
pub fn ports_held(ports: &[ServicePort]) -> BTreeMap<u16, u16> {
    ports
        .iter()
        .filter_map(|p| {
            let listener = u16::try_from(p.port).ok()?;
            if p.name.as_deref() != Some(&*port_name(listener)) {
                return None;
            }
            match p.target_port {
                Some(IntOrString::Int(pod)) => Some((listener, u16::try_from(pod).ok()?)),
                _ => None,
            }
        })
        .collect()
}

fn fnv(s: &str) -> u32 {
    s.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}
