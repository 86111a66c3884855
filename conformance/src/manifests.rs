//! Kubernetes manifests for tests: builders for IngressClass, Service, per-family EndpointSlices
//! and Ingress objects, a block-YAML writer, and a temporary manifest folder whose files are
//! replaced atomically (so a watcher never reads half a file).

use std::fmt::Write as _;
use std::io::{self, Write as _};
use std::path::Path;

use serde_json::{json, Map, Value};

use crate::echo::Family;

/// The controller name duet claims by default.
pub const CONTROLLER: &str = "duet.dev/ingress-controller";

/// The annotation that sets the family policy of one Ingress.
pub const FAMILY_ANNOTATION: &str = "duet.dev/upstream-family";

/// Renders a JSON value as block YAML (strings double-quoted, JSON escapes).
pub fn to_yaml(value: &Value) -> String {
    let mut out = String::new();
    match value {
        Value::Object(map) if !map.is_empty() => emit_map(map, 0, &mut out),
        Value::Array(items) if !items.is_empty() => emit_seq(items, 0, &mut out),
        other => {
            out.push_str(&scalar(other));
            out.push('\n');
        }
    }
    out
}

/// Renders several objects as one multi-document YAML file.
pub fn to_yaml_docs(docs: &[Value]) -> String {
    let mut out = String::new();
    for doc in docs {
        out.push_str("---\n");
        out.push_str(&to_yaml(doc));
    }
    out
}

fn scalar(v: &Value) -> String {
    match v {
        Value::Object(_) => "{}".into(),
        Value::Array(_) => "[]".into(),
        Value::String(s) => Value::String(s.clone()).to_string(),
        other => other.to_string(),
    }
}

fn is_block(v: &Value) -> bool {
    match v {
        Value::Object(m) => !m.is_empty(),
        Value::Array(a) => !a.is_empty(),
        _ => false,
    }
}

fn emit_map(map: &Map<String, Value>, indent: usize, out: &mut String) {
    for (key, value) in map {
        let key = Value::String(key.clone()).to_string();
        if is_block(value) {
            let _ = writeln!(out, "{:indent$}{key}:", "");
            match value {
                Value::Object(m) => emit_map(m, indent + 2, out),
                Value::Array(a) => emit_seq(a, indent + 2, out),
                _ => {}
            }
        } else {
            let _ = writeln!(out, "{:indent$}{key}: {}", "", scalar(value));
        }
    }
}

fn emit_seq(items: &[Value], indent: usize, out: &mut String) {
    for item in items {
        match item {
            Value::Object(m) if !m.is_empty() => {
                // `- key: v` then the remaining keys aligned under the first.
                let mut inner = String::new();
                emit_map(m, indent + 2, &mut inner);
                let _ = write!(out, "{:indent$}- ", "");
                out.push_str(&inner[indent + 2..]);
            }
            Value::Array(a) if !a.is_empty() => {
                let _ = writeln!(out, "{:indent$}-", "");
                emit_seq(a, indent + 2, out);
            }
            other => {
                let _ = writeln!(out, "{:indent$}- {}", "", scalar(other));
            }
        }
    }
}

/// An IngressClass handled by `controller`.
pub fn ingress_class(name: &str, controller: &str) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "IngressClass",
        "metadata": {"name": name},
        "spec": {"controller": controller},
    })
}

/// A selector-less dual-stack Service with named ports (`(name, port)`), each with
/// `targetPort` equal to its name.
pub fn service(namespace: &str, name: &str, ports: &[(&str, u16)]) -> Value {
    let ports: Vec<Value> = ports
        .iter()
        .map(|(port_name, port)| {
            json!({"name": port_name, "port": port, "protocol": "TCP", "targetPort": port_name})
        })
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "ipFamilyPolicy": "RequireDualStack",
            "ipFamilies": ["IPv4", "IPv6"],
            "ports": ports,
        },
    })
}

/// One endpoint of a slice: a pod's address of the slice's family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// The pod name (`targetRef.name`).
    pub pod: String,
    /// The pod uid (`targetRef.uid`): the key that joins a pod's IPv4 and IPv6 endpoints.
    pub uid: String,
    /// The IP address.
    pub ip: std::net::IpAddr,
    /// `conditions.ready`.
    pub ready: bool,
}

/// An EndpointSlice of one family for a Service, all endpoints on one port named `port_name`.
pub fn endpoint_slice(
    namespace: &str,
    service: &str,
    name: &str,
    family: Family,
    port_name: &str,
    port: u16,
    endpoints: &[Endpoint],
) -> Value {
    let endpoints: Vec<Value> = endpoints
        .iter()
        .map(|e| {
            json!({
                "addresses": [e.ip.to_string()],
                "conditions": {"ready": e.ready, "serving": e.ready, "terminating": false},
                "targetRef": {"kind": "Pod", "namespace": namespace, "name": e.pod, "uid": e.uid},
            })
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                "kubernetes.io/service-name": service,
                "endpointslice.kubernetes.io/managed-by": "conformance.duet.dev",
            },
        },
        "addressType": match family { Family::V4 => "IPv4", Family::V6 => "IPv6" },
        "endpoints": endpoints,
        "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
    })
}

/// A Service port as an Ingress backend names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PortRef {
    /// `port.name`.
    Name(String),
    /// `port.number`.
    Number(u16),
}

impl PortRef {
    fn to_json(&self) -> Value {
        match self {
            PortRef::Name(n) => json!({"name": n}),
            PortRef::Number(n) => json!({"number": n}),
        }
    }
}

/// `pathType` of an Ingress path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathType {
    /// `Exact`.
    Exact,
    /// `Prefix`.
    Prefix,
    /// `ImplementationSpecific`.
    ImplementationSpecific,
}

impl PathType {
    fn as_str(self) -> &'static str {
        match self {
            PathType::Exact => "Exact",
            PathType::Prefix => "Prefix",
            PathType::ImplementationSpecific => "ImplementationSpecific",
        }
    }
}

/// Builds a `networking.k8s.io/v1` Ingress.
#[derive(Clone, Debug)]
pub struct Ingress {
    namespace: String,
    name: String,
    class: Option<String>,
    created: Option<String>,
    annotations: Vec<(String, String)>,
    default_backend: Option<(String, PortRef)>,
    rules: Vec<(Option<String>, Vec<Value>)>,
    tls: Vec<(Vec<String>, String)>,
}

/// The prefix of ingress-nginx's annotations.
pub const NGINX_ANNOTATION_PREFIX: &str = "nginx.ingress.kubernetes.io/";

impl Ingress {
    /// An Ingress of class `duet` with no rules yet.
    pub fn new(namespace: &str, name: &str) -> Ingress {
        Ingress {
            namespace: namespace.into(),
            name: name.into(),
            class: Some("duet".into()),
            created: None,
            annotations: Vec::new(),
            default_backend: None,
            rules: Vec::new(),
            tls: Vec::new(),
        }
    }

    /// Sets or clears `spec.ingressClassName`.
    pub fn class(mut self, class: Option<&str>) -> Ingress {
        self.class = class.map(str::to_owned);
        self
    }

    /// Sets `metadata.creationTimestamp` (RFC 3339), which decides conflicts between Ingresses.
    pub fn created(mut self, timestamp: &str) -> Ingress {
        self.created = Some(timestamp.into());
        self
    }

    /// Adds an annotation.
    pub fn annotation(mut self, key: &str, value: &str) -> Ingress {
        self.annotations.push((key.into(), value.into()));
        self
    }

    /// Adds each `(KEY, value)` as the ingress-nginx annotation `nginx.ingress.kubernetes.io/KEY`.
    pub fn nginx_annotations(self, pairs: &[(&str, &str)]) -> Ingress {
        pairs.iter().fold(self, |i, (k, v)| {
            i.annotation(&format!("{NGINX_ANNOTATION_PREFIX}{k}"), v)
        })
    }

    /// Sets `spec.defaultBackend`.
    pub fn default_backend(mut self, service: &str, port: PortRef) -> Ingress {
        self.default_backend = Some((service.into(), port));
        self
    }

    /// Adds a path under `host` (`None`: a rule without host), merging with an existing rule of
    /// the same host.
    pub fn path(
        mut self,
        host: Option<&str>,
        path_type: PathType,
        path: &str,
        service: &str,
        port: PortRef,
    ) -> Ingress {
        let entry = json!({
            "path": path,
            "pathType": path_type.as_str(),
            "backend": {"service": {"name": service, "port": port.to_json()}},
        });
        let host = host.map(str::to_owned);
        match self.rules.iter_mut().find(|(h, _)| *h == host) {
            Some((_, paths)) => paths.push(entry),
            None => self.rules.push((host, vec![entry])),
        }
        self
    }

    /// Shorthand: `/` Prefix on `host` to `service` port `http`.
    pub fn host(self, host: &str, service: &str) -> Ingress {
        self.path(
            Some(host),
            PathType::Prefix,
            "/",
            service,
            PortRef::Name("http".into()),
        )
    }

    /// Adds a `spec.tls` entry: `hosts` (may be empty) served with the Secret `secret`.
    pub fn tls(mut self, hosts: &[&str], secret: &str) -> Ingress {
        self.tls
            .push((hosts.iter().map(|h| h.to_string()).collect(), secret.into()));
        self
    }

    /// The object as JSON.
    pub fn build(&self) -> Value {
        let mut metadata = json!({"name": self.name, "namespace": self.namespace});
        if let Some(created) = &self.created {
            metadata["creationTimestamp"] = json!(created);
        }
        if !self.annotations.is_empty() {
            let annotations: Map<String, Value> = self
                .annotations
                .iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect();
            metadata["annotations"] = Value::Object(annotations);
        }
        let mut spec = Map::new();
        if let Some(class) = &self.class {
            spec.insert("ingressClassName".into(), json!(class));
        }
        if let Some((service, port)) = &self.default_backend {
            spec.insert(
                "defaultBackend".into(),
                json!({"service": {"name": service, "port": port.to_json()}}),
            );
        }
        if !self.rules.is_empty() {
            let rules: Vec<Value> = self
                .rules
                .iter()
                .map(|(host, paths)| {
                    let mut rule = Map::new();
                    if let Some(host) = host {
                        rule.insert("host".into(), json!(host));
                    }
                    rule.insert("http".into(), json!({"paths": paths}));
                    Value::Object(rule)
                })
                .collect();
            spec.insert("rules".into(), Value::Array(rules));
        }
        if !self.tls.is_empty() {
            let tls: Vec<Value> = self
                .tls
                .iter()
                .map(|(hosts, secret)| {
                    if hosts.is_empty() {
                        json!({"secretName": secret})
                    } else {
                        json!({"hosts": hosts, "secretName": secret})
                    }
                })
                .collect();
            spec.insert("tls".into(), Value::Array(tls));
        }
        json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "Ingress",
            "metadata": metadata,
            "spec": Value::Object(spec),
        })
    }
}

/// A temporary folder of manifests, removed on drop.
#[derive(Debug)]
pub struct ManifestDir {
    dir: tempfile::TempDir,
}

impl ManifestDir {
    /// An empty folder.
    pub fn new() -> io::Result<ManifestDir> {
        Ok(ManifestDir {
            dir: tempfile::Builder::new()
                .prefix("duet-manifests-")
                .tempdir()?,
        })
    }

    /// A folder holding `class.yaml`: the IngressClass `duet` of duet's default controller.
    pub fn with_class() -> io::Result<ManifestDir> {
        let dir = ManifestDir::new()?;
        dir.write("class.yaml", &[ingress_class("duet", CONTROLLER)])?;
        Ok(dir)
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes objects as one multi-document YAML file, replacing any file of that name.
    pub fn write(&self, file: &str, docs: &[Value]) -> io::Result<()> {
        self.write_raw(file, &to_yaml_docs(docs))
    }

    /// Writes text to a file atomically: a hidden temporary file (not `*.yaml`) renamed over it.
    pub fn write_raw(&self, file: &str, text: &str) -> io::Result<()> {
        let mut tmp = tempfile::Builder::new()
            .prefix(".tmp-")
            .suffix(".partial")
            .tempfile_in(self.dir.path())?;
        tmp.write_all(text.as_bytes())?;
        tmp.flush()?;
        tmp.persist(self.dir.path().join(file))
            .map_err(|e| e.error)?;
        Ok(())
    }

    /// Deletes a file.
    pub fn remove(&self, file: &str) -> io::Result<()> {
        std::fs::remove_file(self.dir.path().join(file))
    }
}

/// The GatewayClass `duet`, handled by duet's Gateway controller (`duet.dev/gateway-controller`):
/// the class every end-to-end Gateway names.
pub fn gateway_class() -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
        "metadata": {"name": "duet"},
        "spec": {"controllerName": "duet.dev/gateway-controller"}
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_of_nested_objects() {
        let v = json!({"a": {"b": [{"c": 1, "d": "x"}, "y", []], "e": {}}, "f": true});
        let yaml = to_yaml(&v);
        assert_eq!(
            yaml,
            "\"a\":\n  \"b\":\n    - \"c\": 1\n      \"d\": \"x\"\n    - \"y\"\n    - []\n  \"e\": {}\n\"f\": true\n"
        );
    }

    #[test]
    fn ingress_merges_paths_per_host() {
        let ing = Ingress::new("ns", "i")
            .path(Some("a"), PathType::Exact, "/x", "s", PortRef::Number(80))
            .path(
                Some("a"),
                PathType::Prefix,
                "/",
                "s",
                PortRef::Name("http".into()),
            )
            .build();
        assert_eq!(ing["spec"]["rules"].as_array().unwrap().len(), 1);
        assert_eq!(
            ing["spec"]["rules"][0]["http"]["paths"][0]["pathType"],
            "Exact"
        );
        assert_eq!(ing["spec"]["ingressClassName"], "duet");
    }
}
