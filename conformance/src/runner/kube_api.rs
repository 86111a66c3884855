//! The runner's Kubernetes API client: objects as JSON over the unmodified kube client, for the
//! few kinds the conformance steps create, read and delete. The same code talks to the real
//! control plane the runner starts and to a cluster of `--kubeconfig`.

use std::path::Path;

use anyhow::{bail, Context};
use http::{Method, Request};
use serde_json::Value;

/// How a kind is addressed: `(apiVersion, kind, plural, namespaced)`.
const KINDS: &[(&str, &str, &str, bool)] = &[
    ("v1", "Namespace", "namespaces", false),
    ("v1", "Service", "services", true),
    ("v1", "Secret", "secrets", true),
    ("v1", "Pod", "pods", true),
    ("v1", "Node", "nodes", false),
    ("v1", "ConfigMap", "configmaps", true),
    ("v1", "ServiceAccount", "serviceaccounts", true),
    ("apps/v1", "DaemonSet", "daemonsets", true),
    (
        "apiextensions.k8s.io/v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        false,
    ),
    ("rbac.authorization.k8s.io/v1", "Role", "roles", true),
    (
        "rbac.authorization.k8s.io/v1",
        "ClusterRole",
        "clusterroles",
        false,
    ),
    (
        "rbac.authorization.k8s.io/v1",
        "RoleBinding",
        "rolebindings",
        true,
    ),
    (
        "rbac.authorization.k8s.io/v1",
        "ClusterRoleBinding",
        "clusterrolebindings",
        false,
    ),
    (
        "metallb.io/v1beta1",
        "IPAddressPool",
        "ipaddresspools",
        true,
    ),
    (
        "metallb.io/v1beta1",
        "L2Advertisement",
        "l2advertisements",
        true,
    ),
    (
        "metallb.io/v1beta1",
        "ServiceL2Status",
        "servicel2statuses",
        true,
    ),
    ("apps/v1", "Deployment", "deployments", true),
    (
        "discovery.k8s.io/v1",
        "EndpointSlice",
        "endpointslices",
        true,
    ),
    ("networking.k8s.io/v1", "Ingress", "ingresses", true),
    ("coordination.k8s.io/v1", "Lease", "leases", true),
    ("events.k8s.io/v1", "Event", "events", true),
    (
        "networking.k8s.io/v1",
        "IngressClass",
        "ingressclasses",
        false,
    ),
    (
        "gateway.networking.k8s.io/v1",
        "GatewayClass",
        "gatewayclasses",
        false,
    ),
    ("gateway.networking.k8s.io/v1", "Gateway", "gateways", true),
    (
        "gateway.networking.k8s.io/v1",
        "ReferenceGrant",
        "referencegrants",
        true,
    ),
    (
        "gateway.networking.k8s.io/v1",
        "HTTPRoute",
        "httproutes",
        true,
    ),
    (
        "gateway.networking.k8s.io/v1",
        "GRPCRoute",
        "grpcroutes",
        true,
    ),
    (
        "gateway.networking.k8s.io/v1",
        "TLSRoute",
        "tlsroutes",
        true,
    ),
    (
        "gateway.networking.k8s.io/v1",
        "ListenerSet",
        "listenersets",
        true,
    ),
];

/// A client for one API server.
#[derive(Clone)]
pub struct KubeApi {
    client: kube::Client,
}

impl std::fmt::Debug for KubeApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KubeApi")
    }
}

/// The collection path of a kind, in a namespace when it is namespaced.
fn collection(api_version: &str, kind: &str, ns: Option<&str>) -> anyhow::Result<String> {
    let &(_, _, plural, namespaced) = KINDS
        .iter()
        .find(|(v, k, _, _)| *v == api_version && *k == kind)
        .with_context(|| format!("the runner does not handle {api_version} {kind}"))?;
    let root = if api_version.contains('/') {
        format!("/apis/{api_version}")
    } else {
        format!("/api/{api_version}")
    };
    Ok(match (namespaced, ns) {
        (true, Some(ns)) => format!("{root}/namespaces/{ns}/{plural}"),
        (true, None) => bail!("{kind} is namespaced: no namespace given"),
        (false, _) => format!("{root}/{plural}"),
    })
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

impl KubeApi {
    /// A client for the API server of a kubeconfig file (its current context).
    pub async fn from_kubeconfig(path: &Path) -> anyhow::Result<KubeApi> {
        let kubeconfig = kube::config::Kubeconfig::read_from(path)
            .with_context(|| format!("cannot read the kubeconfig {}", path.display()))?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .with_context(|| format!("cannot use the kubeconfig {}", path.display()))?;
        Ok(KubeApi {
            client: kube::Client::try_from(config)?,
        })
    }

    /// The underlying client (for requests that are not JSON, such as `/readyz`).
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// One request with a JSON body (empty for none), answered with JSON: for paths the
    /// kind table does not cover (subresources such as `pods/NAME/status` or `binding`).
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> Result<Value, kube::Error> {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::CONTENT_TYPE, content_type)
            .header(http::header::ACCEPT, "application/json")
            .body(body)
            .map_err(kube::Error::HttpError)?;
        self.client.request::<Value>(req).await
    }

    /// `GET path` (with its query), answered with JSON; API errors as they came (e.g. a `410
    /// Gone` for a compacted `resourceVersion`).
    pub async fn get_path(&self, path: &str) -> Result<Value, kube::Error> {
        self.send(Method::GET, path, "application/json", Vec::new())
            .await
    }

    /// Creates an object (`apiVersion`, `kind` and `metadata.namespace` say where).
    pub async fn create(&self, obj: Value) -> anyhow::Result<Value> {
        let (v, k) = kind_of(&obj)?;
        let path = collection(&v, &k, obj["metadata"]["namespace"].as_str())?;
        let body = serde_json::to_vec(&obj)?;
        self.send(Method::POST, &path, "application/json", body)
            .await
            .with_context(|| format!("cannot create {k} {}", name_of(&obj)))
    }

    /// Creates or updates an object by server-side apply (field manager `duet-test`, forced):
    /// the object ends up with exactly the fields given.
    pub async fn apply(&self, obj: Value) -> anyhow::Result<Value> {
        let (v, k) = kind_of(&obj)?;
        let name = name_of(&obj);
        let path = format!(
            "{}/{name}?fieldManager=duet-test&force=true",
            collection(&v, &k, obj["metadata"]["namespace"].as_str())?
        );
        let body = serde_json::to_vec(&obj)?;
        self.send(Method::PATCH, &path, "application/apply-patch+yaml", body)
            .await
            .with_context(|| format!("cannot apply {k} {name}"))
    }

    /// One object, `None` when it does not exist.
    pub async fn get(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
    ) -> anyhow::Result<Option<Value>> {
        let path = format!("{}/{name}", collection(api_version, kind, ns)?);
        match self
            .send(Method::GET, &path, "application/json", Vec::new())
            .await
        {
            Ok(v) => Ok(Some(v)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(e).with_context(|| format!("cannot read {kind} {name}")),
        }
    }

    /// The objects of a kind in a namespace matching a label selector (`""` for all).
    pub async fn list(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        label_selector: &str,
    ) -> anyhow::Result<Vec<Value>> {
        let mut path = collection(api_version, kind, ns)?;
        if !label_selector.is_empty() {
            path = format!("{path}?labelSelector={}", encode(label_selector));
        }
        let list = self
            .send(Method::GET, &path, "application/json", Vec::new())
            .await
            .with_context(|| format!("cannot list {kind}"))?;
        Ok(list["items"].as_array().cloned().unwrap_or_default())
    }

    /// Applies a JSON merge patch to an object.
    pub async fn merge_patch(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
        patch: &Value,
    ) -> anyhow::Result<Value> {
        let path = format!("{}/{name}", collection(api_version, kind, ns)?);
        self.send(
            Method::PATCH,
            &path,
            "application/merge-patch+json",
            serde_json::to_vec(patch)?,
        )
        .await
        .with_context(|| format!("cannot patch {kind} {name}"))
    }

    /// Deletes an object at once, its dependents in the background (as upstream does); a
    /// missing object is not an error.
    pub async fn delete(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
    ) -> anyhow::Result<()> {
        let path = format!(
            "{}/{name}?gracePeriodSeconds=0&propagationPolicy=Background",
            collection(api_version, kind, ns)?
        );
        match self
            .send(Method::DELETE, &path, "application/json", Vec::new())
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(e).with_context(|| format!("cannot delete {kind} {name}")),
        }
    }
}

fn kind_of(obj: &Value) -> anyhow::Result<(String, String)> {
    let v = obj["apiVersion"]
        .as_str()
        .context("object without apiVersion")?;
    let k = obj["kind"].as_str().context("object without kind")?;
    Ok((v.to_owned(), k.to_owned()))
}

fn name_of(obj: &Value) -> String {
    let meta = &obj["metadata"];
    meta["name"]
        .as_str()
        .or(meta["generateName"].as_str())
        .unwrap_or_default()
        .to_owned()
}

/// Percent-encodes a query value (label selectors hold `=`, `,` and `!`).
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_follow_the_api_layout() {
        assert_eq!(
            collection("apps/v1", "Deployment", Some("ns")).unwrap(),
            "/apis/apps/v1/namespaces/ns/deployments"
        );
        assert_eq!(
            collection("v1", "Namespace", None).unwrap(),
            "/api/v1/namespaces"
        );
        assert!(collection("v1", "Service", None).is_err());
        assert_eq!(
            encode("kubernetes.io/service-name=a"),
            "kubernetes.io%2Fservice-name%3Da"
        );
    }
}
