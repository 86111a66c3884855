//! One way to read a per-object annotation: read it, parse it, else diagnose and fall back.
//! Every `duet.dev/` annotation translation reads goes through [`annotation`], so an invalid value
//! is always an `InvalidAnnotation` diagnostic `NAME: WHAT IS WRONG; WHAT APPLIES INSTEAD` and the
//! object is still served.

use std::collections::BTreeMap;
use std::fmt::Display;

use super::diagnostic::{Diagnostic, Reason};
use crate::object::ObjectKey;
use crate::stored::{Annotations, StoredIngress};

/// One `duet.dev/` annotation: its name, the values it takes and what it does. The parsers read
/// the names from [`DUET_ANNOTATIONS`], and the reference page is rendered from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DuetAnnotation {
    /// The full key (`duet.dev/...`).
    pub name: &'static str,
    /// The values it takes.
    pub value: &'static str,
    /// What applies without it.
    pub default: &'static str,
    /// What it does.
    pub meaning: &'static str,
}

/// `duet.dev/upstream-family`.
pub const UPSTREAM_FAMILY: DuetAnnotation = DuetAnnotation {
    name: "duet.dev/upstream-family",
    value: "`PreferSameFamily`, `RequireSameFamily`, `PreferIPv4` or `PreferIPv6`",
    default: "`--upstream-family`",
    meaning: "How the address family of a pod is chosen for this Ingress's routes (or an HTTPRoute's or GRPCRoute's): the client's family first, only the client's family, IPv4 first or IPv6 first.",
};

/// `duet.dev/proxy-body-size`.
pub const PROXY_BODY_SIZE: DuetAnnotation = DuetAnnotation {
    name: "duet.dev/proxy-body-size",
    value: "a size: `512`, `8k`, `10m`, `1g` (at most `64g`); `0` = unlimited",
    default: "`--max-body-size`",
    meaning: "Largest request body of this Ingress's routes; a larger declared body is answered 413. Wins over `nginx.ingress.kubernetes.io/proxy-body-size`.",
};

/// `duet.dev/proxy-connect-timeout`.
pub const PROXY_CONNECT_TIMEOUT: DuetAnnotation = DuetAnnotation {
    name: "duet.dev/proxy-connect-timeout",
    value: "a duration: `5s`, `500ms`, `2m`, or a number of seconds",
    default: "`--connect-timeout`",
    meaning: "Upstream connect timeout per attempt for this Ingress's routes. Wins over `nginx.ingress.kubernetes.io/proxy-connect-timeout`.",
};

/// `duet.dev/proxy-read-timeout`.
pub const PROXY_READ_TIMEOUT: DuetAnnotation = DuetAnnotation {
    name: "duet.dev/proxy-read-timeout",
    value: "a duration: `60s`, `500ms`, `2m`, or a number of seconds",
    default: "`--upstream-timeout`",
    meaning: "Time to wait for the upstream's response head, and between reads of its body, before answering 504. Wins over `nginx.ingress.kubernetes.io/proxy-read-timeout`.",
};

/// `duet.dev/ssl-redirect`.
pub const SSL_REDIRECT: DuetAnnotation = DuetAnnotation {
    name: "duet.dev/ssl-redirect",
    value: "`\"true\"` or `\"false\"`",
    default: "`\"true\"`",
    meaning: "`\"false\"` turns off the 308 redirect from plain HTTP to HTTPS of the hosts listed under `spec.tls`. Wins over `nginx.ingress.kubernetes.io/ssl-redirect` and `force-ssl-redirect`.",
};

/// `duet.dev/limit-ipv6-prefix`.
pub const LIMIT_IPV6_PREFIX: DuetAnnotation = DuetAnnotation {
    name: "duet.dev/limit-ipv6-prefix",
    value: "a prefix length from `1` to `128`",
    default: "`128` (per address, as ingress-nginx)",
    meaning: "The prefix IPv6 clients are keyed by in the ingress-nginx rate limits (`limit-rps`, `limit-rpm`, `limit-connections`): `64` counts a host by the /64 it owns, so rotating addresses inside it does not escape the limit. IPv4 clients are keyed per address.",
};

/// `duet.dev/backend-ca-secret`.
pub const BACKEND_CA_SECRET: DuetAnnotation = DuetAnnotation {
    name: "duet.dev/backend-ca-secret",
    value: "the name of a Secret in the Ingress's namespace with a PEM `ca.crt`",
    default: "the system trust roots",
    meaning: "Verifies the certificates of TLS upstreams (`appProtocol` `https`, `h2`, `grpcs`, `wss`) against this CA bundle. A missing Secret (`MissingSecret`) or one without a usable `ca.crt` (`InvalidBackendTls`) makes the Ingress's TLS routes answer 502.",
};

/// `duet.dev/backend-tls-skip-verify`.
pub const BACKEND_TLS_SKIP_VERIFY: DuetAnnotation = DuetAnnotation {
    name: "duet.dev/backend-tls-skip-verify",
    value: "`\"true\"` or `\"false\"`",
    default: "`\"false\"`",
    meaning: "`\"true\"`: the certificates of TLS upstreams are not verified (reported as an `InsecureBackendTls` warning).",
};

/// `duet.dev/backend-tls-server-name`.
pub const BACKEND_TLS_SERVER_NAME: DuetAnnotation = DuetAnnotation {
    name: "duet.dev/backend-tls-server-name",
    value: "a DNS name or an IP address",
    default: "`SERVICE.NAMESPACE.svc` (never the pod's address)",
    meaning: "The server name sent to TLS upstreams (SNI) and verified in their certificate.",
};

/// Every `duet.dev/` annotation duet reads.
pub const DUET_ANNOTATIONS: [DuetAnnotation; 9] = [
    UPSTREAM_FAMILY,
    PROXY_BODY_SIZE,
    PROXY_CONNECT_TIMEOUT,
    PROXY_READ_TIMEOUT,
    SSL_REDIRECT,
    LIMIT_IPV6_PREFIX,
    BACKEND_CA_SECRET,
    BACKEND_TLS_SKIP_VERIFY,
    BACKEND_TLS_SERVER_NAME,
];

/// An object's annotations as translation reads them: the API's map, or a stored Ingress's
/// [`Annotations`].
pub trait AnnotationMap: std::fmt::Debug {
    /// The value of the annotation `name`.
    fn value(&self, name: &str) -> Option<&str>;
    /// Every annotation, by name.
    fn pairs(&self) -> Box<dyn Iterator<Item = (&str, &str)> + '_>;
}

impl AnnotationMap for BTreeMap<String, String> {
    fn value(&self, name: &str) -> Option<&str> {
        self.get(name).map(String::as_str)
    }

    fn pairs(&self) -> Box<dyn Iterator<Item = (&str, &str)> + '_> {
        Box::new(self.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }
}

impl AnnotationMap for Annotations {
    fn value(&self, name: &str) -> Option<&str> {
        self.get(name)
    }

    fn pairs(&self) -> Box<dyn Iterator<Item = (&str, &str)> + '_> {
        Box::new(self.iter())
    }
}

/// An object's annotations, with the key its diagnostics name.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Annotated<'a> {
    /// The object.
    pub(crate) key: &'a ObjectKey,
    annotations: Option<&'a dyn AnnotationMap>,
}

impl<'a> Annotated<'a> {
    /// The annotations of the object with `key` and `meta` (tests of annotations alone).
    #[cfg(test)]
    pub(crate) fn new(
        key: &'a ObjectKey,
        meta: &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    ) -> Annotated<'a> {
        Annotated {
            key,
            annotations: meta.annotations.as_ref().map(|a| a as _),
        }
    }

    /// The annotations of the stored Ingress with `key`.
    pub(crate) fn ingress(key: &'a ObjectKey, ingress: &'a StoredIngress) -> Annotated<'a> {
        Annotated {
            key,
            annotations: ingress.metadata.annotations.as_ref().map(|a| a as _),
        }
    }

    /// The value of one annotation as written, if present.
    pub(crate) fn get(&self, name: &str) -> Option<&'a str> {
        self.annotations?.value(name)
    }
}

/// The annotation `name` of `obj` parsed by `parse` (given the value as written); `fallback`'s
/// value when the annotation is absent. A value `parse` refuses is an `InvalidAnnotation`
/// diagnostic `"{name}: {error}; {fallback's words}"`, and the fallback applies.
pub(crate) fn annotation<T>(
    obj: &Annotated<'_>,
    name: &str,
    parse: impl FnOnce(&str) -> Result<T, String>,
    (fallback, instead): (T, impl Display),
    diagnostics: &mut Vec<Diagnostic>,
) -> T {
    let Some(value) = obj.get(name) else {
        return fallback;
    };
    match parse(value) {
        Ok(parsed) => parsed,
        Err(error) => {
            diagnostics.push(Diagnostic::new(
                obj.key.clone(),
                Reason::InvalidAnnotation,
                format!("{name}: {error}; {instead}"),
            ));
            fallback
        }
    }
}

/// `"true"` or `"false"` (after trimming), exactly.
pub(crate) fn parse_true_false(value: &str) -> Result<bool, String> {
    match value.trim() {
        "true" => Ok(true),
        "false" => Ok(false),
        other => Err(format!("{other:?} is not \"true\" or \"false\"")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::Kind;

    /// The string literals of the controller's sources that name a `duet.dev/` key.
    fn literal_keys() -> Vec<(String, String)> {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = vec![src];
        let mut found = Vec::new();
        while let Some(path) = files.pop() {
            if path.is_dir() {
                files.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            for (i, _) in text.match_indices("\"duet.dev/") {
                let rest = &text[i + 1..];
                let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || "./-".contains(c)));
                let key = &rest[..end.unwrap_or(rest.len())];
                if rest[key.len()..].starts_with('"') && key.len() > "duet.dev/".len() {
                    found.push((key.to_owned(), path.display().to_string()));
                }
            }
        }
        found
    }

    #[test]
    fn every_duet_annotation_in_the_code_is_in_the_table() {
        let controllers = ["duet.dev/ingress-controller", "duet.dev/gateway-controller"];
        let keys = literal_keys();
        assert!(
            keys.iter().any(|(k, _)| k == UPSTREAM_FAMILY.name),
            "{keys:?}"
        );
        for (key, file) in keys {
            let known = DUET_ANNOTATIONS.iter().any(|a| a.name == key);
            assert!(
                known || controllers.contains(&key.as_str()),
                "{file} names {key}: add it to DUET_ANNOTATIONS (translate/annotation.rs) and run docs/generate-reference.sh"
            );
        }
    }

    #[test]
    fn absent_parsed_or_diagnosed_and_fallen_back() {
        let key = ObjectKey::new(Kind::Ingress, "ns", "web");
        let mut ingress = StoredIngress::default();
        ingress.metadata.annotations = Some(
            [("a/good", "7"), ("a/bad", "x")]
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .into_iter()
                .collect(),
        );
        let obj = Annotated::ingress(&key, &ingress);
        let parse = |v: &str| {
            v.parse::<u8>()
                .map_err(|_| format!("{v:?} is not a number"))
        };
        let mut diagnostics = Vec::new();
        let mut read = |name| annotation(&obj, name, parse, (1, "using 1"), &mut diagnostics);
        assert_eq!([read("a/good"), read("a/absent"), read("a/bad")], [7, 1, 1]);
        assert_eq!(
            diagnostics,
            [Diagnostic::new(
                key.clone(),
                Reason::InvalidAnnotation,
                "a/bad: \"x\" is not a number; using 1"
            )]
        );
    }
}
