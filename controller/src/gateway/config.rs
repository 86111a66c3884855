//! The Gateway API flags of `duet serve` (Kubernetes mode), validated once at start.

use std::collections::BTreeMap;

use clap::Args;

/// The `spec.controllerName` of duet's GatewayClasses unless `--gateway-controller-name` says
/// otherwise.
pub use crate::gateway_api::DEFAULT_CONTROLLER_NAME;

/// The labels of duet's own pods unless `--gateway-pod-selector` says otherwise (the chart's
/// selector labels without the release name).
pub const DEFAULT_POD_SELECTOR: &str =
    "app.kubernetes.io/name=duet,app.kubernetes.io/component=controller";

/// Flags of the Gateway API controllers.
#[derive(Debug, Args)]
pub struct GatewayArgs {
    /// The spec.controllerName of the GatewayClasses duet implements (a domain-prefixed path).
    #[arg(long, value_name = "NAME", default_value = DEFAULT_CONTROLLER_NAME)]
    pub gateway_controller_name: String,

    /// Labels of duet's pods (in duet's namespace: POD_NAMESPACE, else the kubeconfig's) that
    /// every Gateway's Service sends traffic to, as key=value pairs separated by commas.
    #[arg(long, value_name = "KEY=VALUE,...", default_value = DEFAULT_POD_SELECTOR)]
    pub gateway_pod_selector: String,
}

/// The Gateway API settings, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatewayConfig {
    /// GatewayClasses with this `spec.controllerName` are ours.
    pub controller_name: String,
    /// The labels selecting duet's pods.
    pub pod_selector: BTreeMap<String, String>,
    /// `--watch-namespace` (empty: every namespace). A Gateway outside these namespaces is not
    /// ours whatever its class: duet serves no route of it, so it gets no Service and no status.
    pub namespaces: Vec<String>,
    /// HTTP/3 is on (`--http3`): each Gateway's Service also lists its HTTPS listener ports over
    /// UDP.
    pub http3: bool,
}

impl Default for GatewayConfig {
    fn default() -> GatewayConfig {
        GatewayConfig {
            controller_name: DEFAULT_CONTROLLER_NAME.to_owned(),
            pod_selector: parse_selector(DEFAULT_POD_SELECTOR).unwrap_or_default(),
            namespaces: Vec::new(),
            http3: false,
        }
    }
}

impl GatewayConfig {
    /// Whether duet watches `namespace`.
    pub fn watches(&self, namespace: &str) -> bool {
        self.namespaces.is_empty() || self.namespaces.iter().any(|ns| ns == namespace)
    }

    /// The pod selector as a label selector string (`a=b,c=d`).
    pub fn selector_string(&self) -> String {
        self.pod_selector
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Validates the flags; the error is the one usage line.
pub fn from_args(args: GatewayArgs) -> Result<GatewayConfig, String> {
    if !is_controller_name(&args.gateway_controller_name) {
        return Err(format!(
            "invalid value '{}' for '--gateway-controller-name': expected a domain-prefixed path such as {DEFAULT_CONTROLLER_NAME}",
            args.gateway_controller_name
        ));
    }
    let pod_selector = parse_selector(&args.gateway_pod_selector).map_err(|why| {
        format!(
            "invalid value '{}' for '--gateway-pod-selector': {why}",
            args.gateway_pod_selector
        )
    })?;
    Ok(GatewayConfig {
        controller_name: args.gateway_controller_name,
        pod_selector,
        namespaces: Vec::new(),
        http3: false,
    })
}

/// Whether `s` is a GatewayClass controller name as the CRD validates it: a DNS subdomain, `/`,
/// and a path of URL characters; at most 253 characters.
pub fn is_controller_name(s: &str) -> bool {
    let Some((domain, path)) = s.split_once('/') else {
        return false;
    };
    s.len() <= 253
        && is_dns_subdomain(domain)
        && !path.is_empty()
        && path
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/-._~%!$&'()*+,;=:".contains(&b))
}

/// `key=value,...` into labels; keys and values as Kubernetes allows them.
pub fn parse_selector(s: &str) -> Result<BTreeMap<String, String>, String> {
    let mut labels = BTreeMap::new();
    for pair in s.split(',') {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(format!("'{pair}' is not key=value"));
        };
        let (key, value) = (key.trim(), value.trim());
        if !is_label_key(key) || !is_label_value(value) {
            return Err(format!("'{pair}' is not a valid label"));
        }
        labels.insert(key.to_owned(), value.to_owned());
    }
    if labels.is_empty() {
        return Err("no label".to_owned());
    }
    Ok(labels)
}

/// Whether `s` is a DNS-1123 subdomain: dot-separated DNS labels, at most 253 characters.
/// (The same rule as `crate::config`'s; kept here so this module imports nothing above it.)
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// Whether `s` is a DNS label: lowercase letters, digits and `-`, at most 63, no `-` at an end.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_label_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
}

fn is_label_key(s: &str) -> bool {
    match s.rsplit_once('/') {
        Some((prefix, name)) => is_dns_subdomain(prefix) && is_label_name(name),
        None => is_label_name(s),
    }
}

fn is_label_value(s: &str) -> bool {
    s.is_empty() || is_label_name(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_names_and_selectors_are_validated() {
        assert!(is_controller_name(DEFAULT_CONTROLLER_NAME));
        assert!(is_controller_name("example.com/a/b-c"));
        for bad in [
            "",
            "duet",
            "/x",
            "Duet.dev/x",
            "duet.dev/",
            "a b/c",
            "duet.dev/a b",
        ] {
            assert!(!is_controller_name(bad), "{bad:?}");
        }
        let default = GatewayConfig::default();
        assert_eq!(default.pod_selector.len(), 2);
        assert_eq!(
            default.selector_string(),
            "app.kubernetes.io/component=controller,app.kubernetes.io/name=duet"
        );
        for bad in ["", "a", "a=b,", "=b", "a=b c", "-a=b", "a/b/c=d"] {
            assert!(parse_selector(bad).is_err(), "{bad:?}");
        }
    }
}
