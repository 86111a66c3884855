//! ingress-nginx's `ssl-passthrough` in the table: exact hosts whose HTTPS connections are
//! relayed as TCP, chosen by the ClientHello's server name (SNI), to a target of the backend of
//! the host's `/` rule, without terminating TLS. Plain data.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

use super::{BackendId, FamilyPolicy, Origin};

/// Where the HTTPS connections of one passthrough host go.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Passthrough {
    /// The backend of the host's `/` rule.
    pub backend: BackendId,
    /// The family policy of that rule's Ingress.
    pub policy: FamilyPolicy,
    /// The Ingress of that rule.
    pub origin: Arc<Origin>,
}

/// Passthrough hosts, exact names in lower case without a trailing dot.
pub type PassthroughHosts = BTreeMap<Box<str>, Passthrough>;

/// The passthrough of a TLS server name, if it names a passthrough host (case-insensitive, a
/// trailing dot ignored; exact names only, as ingress-nginx's TLS proxy matches them).
pub fn find<'a>(hosts: &'a PassthroughHosts, sni: &str) -> Option<&'a Passthrough> {
    if hosts.is_empty() {
        return None;
    }
    let mut buf = [0u8; crate::host::MAX_NAME];
    let name = crate::host::normalize_name(sni, &mut buf)?;
    hosts.get(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names_match_exact_hosts_case_insensitively() {
        let pass = Passthrough {
            backend: BackendId::new("ns", "svc", "443"),
            policy: FamilyPolicy::default(),
            origin: Origin {
                kind: Default::default(),
                namespace: "ns".into(),
                name: "ing".into(),
                created: 0,
            }
            .into(),
        };
        let hosts: PassthroughHosts = [("argocd.example.com".into(), pass.clone())].into();
        assert_eq!(find(&hosts, "ArgoCD.Example.com."), Some(&pass));
        assert_eq!(find(&hosts, "other.example.com"), None);
        assert_eq!(find(&hosts, "x.argocd.example.com"), None);
    }
}
