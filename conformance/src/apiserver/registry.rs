//! The resources the test API server knows: group, version, kind, plural, scope, whether a
//! `status` subresource exists, and which fields a field selector may name.

/// One REST resource, e.g. `networking.k8s.io/v1` `Ingress` served as `ingresses`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resource {
    /// API group, empty for the core group (`/api/v1`).
    pub group: String,
    /// API version inside the group, e.g. `v1`.
    pub version: String,
    /// The object kind, e.g. `Ingress`.
    pub kind: String,
    /// The plural used in paths, e.g. `ingresses`.
    pub plural: String,
    /// Objects live in a namespace (`/namespaces/{ns}/...`); otherwise cluster-scoped.
    pub namespaced: bool,
    /// Has a `status` subresource: writes to the main resource keep the stored `.status`, writes
    /// to `/status` change only `.status`.
    pub status: bool,
    /// Extra field-selector fields beyond `metadata.name` and `metadata.namespace`, each with the
    /// JSON pointer it reads (Secrets: `type` → `/type`).
    pub fields: Vec<(String, String)>,
}

impl Resource {
    /// A resource with no status subresource and no extra selectable fields.
    pub fn new(group: &str, version: &str, kind: &str, plural: &str, namespaced: bool) -> Self {
        Resource {
            group: group.to_owned(),
            version: version.to_owned(),
            kind: kind.to_owned(),
            plural: plural.to_owned(),
            namespaced,
            status: false,
            fields: Vec::new(),
        }
    }

    /// The same resource with a `status` subresource.
    pub fn with_status(mut self) -> Self {
        self.status = true;
        self
    }

    /// The same resource with one more selectable field (`name`, read at JSON `pointer`).
    pub fn with_field(mut self, name: &str, pointer: &str) -> Self {
        self.fields.push((name.to_owned(), pointer.to_owned()));
        self
    }

    /// `group/version`, or just `version` for the core group: the objects' `apiVersion`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `plural.group` (or just `plural`), as used in API error messages.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// The path prefix of the group version: `/api/v1` or `/apis/{group}/{version}`.
    pub fn prefix(&self) -> String {
        if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        }
    }
}

/// The resources registered by default: what duet watches and writes, plus what a Helm chart of
/// an ingress controller installs.
pub fn defaults() -> Vec<Resource> {
    let core = |kind: &str, plural: &str, namespaced: bool| {
        Resource::new("", "v1", kind, plural, namespaced)
    };
    let g = Resource::new;
    vec![
        core("Namespace", "namespaces", false).with_status(),
        core("Service", "services", true).with_status(),
        core("Secret", "secrets", true).with_field("type", "/type"),
        core("ConfigMap", "configmaps", true),
        core("Pod", "pods", true)
            .with_status()
            .with_field("spec.nodeName", "/spec/nodeName")
            .with_field("status.phase", "/status/phase"),
        core("Endpoints", "endpoints", true),
        core("ServiceAccount", "serviceaccounts", true),
        core("Event", "events", true)
            .with_field("involvedObject.kind", "/involvedObject/kind")
            .with_field("involvedObject.name", "/involvedObject/name")
            .with_field("involvedObject.namespace", "/involvedObject/namespace")
            .with_field("involvedObject.uid", "/involvedObject/uid")
            .with_field("reason", "/reason")
            .with_field("type", "/type"),
        core("Node", "nodes", false).with_status(),
        g("networking.k8s.io", "v1", "Ingress", "ingresses", true).with_status(),
        g(
            "networking.k8s.io",
            "v1",
            "IngressClass",
            "ingressclasses",
            false,
        ),
        g(
            "networking.k8s.io",
            "v1",
            "NetworkPolicy",
            "networkpolicies",
            true,
        ),
        g(
            "discovery.k8s.io",
            "v1",
            "EndpointSlice",
            "endpointslices",
            true,
        ),
        g("coordination.k8s.io", "v1", "Lease", "leases", true),
        g("events.k8s.io", "v1", "Event", "events", true)
            .with_field("regarding.kind", "/regarding/kind")
            .with_field("regarding.name", "/regarding/name")
            .with_field("regarding.namespace", "/regarding/namespace")
            .with_field("reason", "/reason")
            .with_field("type", "/type"),
        g("apps", "v1", "Deployment", "deployments", true).with_status(),
        g("apps", "v1", "StatefulSet", "statefulsets", true).with_status(),
        g("apps", "v1", "DaemonSet", "daemonsets", true).with_status(),
        g("apps", "v1", "ReplicaSet", "replicasets", true).with_status(),
        g("rbac.authorization.k8s.io", "v1", "Role", "roles", true),
        g(
            "rbac.authorization.k8s.io",
            "v1",
            "ClusterRole",
            "clusterroles",
            false,
        ),
        g(
            "rbac.authorization.k8s.io",
            "v1",
            "RoleBinding",
            "rolebindings",
            true,
        ),
        g(
            "rbac.authorization.k8s.io",
            "v1",
            "ClusterRoleBinding",
            "clusterrolebindings",
            false,
        ),
        g(
            "policy",
            "v1",
            "PodDisruptionBudget",
            "poddisruptionbudgets",
            true,
        )
        .with_status(),
        g(
            "autoscaling",
            "v2",
            "HorizontalPodAutoscaler",
            "horizontalpodautoscalers",
            true,
        )
        .with_status(),
        g(
            "monitoring.coreos.com",
            "v1",
            "ServiceMonitor",
            "servicemonitors",
            true,
        ),
    ]
}
