"""Helm's own install and uninstall of the duet chart (helm-python-sdk: Helm's install action with
server-side apply and OpenAPI validation) into the REAL kube-apiserver and
kube-controller-manager of test_real_cluster.py, on a dual-stack, an IPv4-only and an IPv6-only
cluster. Helm reaches the API server from the host over IPv6 loopback (IPv4 on the IPv4-only
cluster) through a forwarder into the cluster's namespace. The objects are read back as the
server stored them (families and node ports allocated, managed by Helm's apply); the real duet
runs with the installed Deployment's arguments and ServiceAccount against the install; the
uninstall is checked down to the ReplicaSet and Pods the garbage collector removes.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.parse
from pathlib import Path

import helm_python as helm
import pytest

from test_chart import CHART, CLUSTER_RULES, FULLNAME, LEASE_RULES, NAMESPACE, RELEASE, flags
from test_real_cluster import DUET_URLS, RealCluster, cluster, duet_from_deployment, family  # noqa: F401 (fixture)

RBAC = "/apis/rbac.authorization.k8s.io/v1"
NS = f"/namespaces/{NAMESPACE}"

# The Prometheus operator's CRD, its schema left open: the chart's ServiceMonitor must reach a
# real server that serves the kind (the operator's own schema is not part of this repository).
SERVICE_MONITOR_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
    "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
             "names": {"plural": "servicemonitors", "singular": "servicemonitor", "kind": "ServiceMonitor",
                       "listKind": "ServiceMonitorList"},
             "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                 "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]},
}

# Everything the chart installed with the values of the install test, by API path.
INSTALLED = [
    f"/api/v1{NS}/services/{FULLNAME}",
    f"/api/v1{NS}/services/{FULLNAME}-metrics",
    f"/api/v1{NS}/serviceaccounts/{FULLNAME}",
    f"/apis/apps/v1{NS}/deployments/{FULLNAME}",
    f"/apis/policy/v1{NS}/poddisruptionbudgets/{FULLNAME}",
    f"/apis/monitoring.coreos.com/v1{NS}/servicemonitors/{FULLNAME}",
    "/apis/networking.k8s.io/v1/ingressclasses/duet",
    f"{RBAC}/clusterroles/{FULLNAME}",
    f"{RBAC}/clusterrolebindings/{FULLNAME}",
    f"{RBAC}{NS}/roles/{FULLNAME}-leader",
    f"{RBAC}{NS}/rolebindings/{FULLNAME}-leader",
]


def get(cluster: RealCluster, path: str) -> dict:
    status, body = cluster.request("GET", path)
    assert status == 200, (path, status, body.get("message", body))
    return body


def until(deadline_s: float, what: str, check):
    """Polls check() until it returns True; fails with its last answer."""
    deadline = time.monotonic() + deadline_s
    while (last := check()) is not True:
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: still {last!r} after {deadline_s} s")
        time.sleep(0.2)


@contextlib.contextmanager
def helm_config(cluster: RealCluster, tmp_path: Path):
    """Helm's configuration against the cluster, from the host (over IPv6 unless the cluster is
    IPv4-only), release records in memory."""
    kubeconfig = cluster.host_kubeconfig(cluster.families[-1], tmp_path / "helm.kubeconfig")
    with helm.Config(namespace=NAMESPACE, kubeconfig_path=str(kubeconfig), storage_driver="memory") as cfg:
        yield cfg


def install(cfg: helm.Config, values: dict) -> dict:
    release = cfg.install(CHART, RELEASE, values, namespace=NAMESPACE, create_namespace=True)
    assert (release["name"], release["namespace"], release["status"]) == (RELEASE, NAMESPACE, "deployed")
    return release


def rules_of(role: dict) -> set:
    return {
        (group, resource, verb, name)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
        for name in rule.get("resourceNames") or [None]
    }


def owned(cluster: RealCluster, selector: dict) -> list[str]:
    """The ReplicaSets and Pods in the release namespace matching a Deployment's selector."""
    query = urllib.parse.urlencode({"labelSelector": ",".join(f"{k}={v}" for k, v in selector.items())})
    return [f"{kind}/{o['metadata']['name']}"
            for kind, path in (("replicaset", f"/apis/apps/v1{NS}/replicasets"), ("pod", f"/api/v1{NS}/pods"))
            for o in get(cluster, f"{path}?{query}")["items"]]


def test_helm_install_stores_what_the_cluster_allocates_and_uninstall_removes_it(cluster, tmp_path):
    status, answer = cluster.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", SERVICE_MONITOR_CRD)
    assert status == 201, answer
    crd = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{SERVICE_MONITOR_CRD['metadata']['name']}"
    until(30, "ServiceMonitor CRD established", lambda: any(
        c["type"] == "Established" and c["status"] == "True" for c in get(cluster, crd).get("status", {}).get("conditions") or []))
    with helm_config(cluster, tmp_path) as cfg:
        install(cfg, {"ingressClass": {"default": True}, "metrics": {"serviceMonitor": {"enabled": True}}})
        check_installed_objects(cluster)
        selector = get(cluster, f"/apis/apps/v1{NS}/deployments/{FULLNAME}")["spec"]["selector"]["matchLabels"]
        # The real deployment and replicaset controllers make the Deployment's Pods.
        until(60, "a ReplicaSet and 2 Pods of the chart", lambda: (
            True if [o.split("/")[0] for o in owned(cluster, selector)] == ["replicaset", "pod", "pod"] else owned(cluster, selector)))
        cfg.uninstall(RELEASE)
    for path in INSTALLED:
        assert cluster.request("GET", path)[0] == 404, f"{path} left after helm uninstall"
    # The garbage collector removes what the Deployment owned.
    until(60, "no ReplicaSet or Pod of the uninstalled Deployment", lambda: owned(cluster, selector) or True)


def check_installed_objects(cluster: RealCluster):
    service = get(cluster, f"/api/v1{NS}/services/{FULLNAME}")
    spec = service["spec"]
    assert spec["type"] == "LoadBalancer"
    assert spec["ipFamilyPolicy"] == "PreferDualStack"
    # No families listed by the chart: the cluster's own, with a cluster IP each.
    assert spec["ipFamilies"] == cluster.families
    assert [family(ip) for ip in spec["clusterIPs"]] == cluster.families
    assert {p["port"]: p["targetPort"] for p in spec["ports"]} == {80: "http", 443: "https"}
    assert all(30000 <= p["nodePort"] <= 32767 for p in spec["ports"]), spec["ports"]
    assert service["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE
    # Server-side apply (the field manager is Helm's default, the process name); the status is the
    # load balancer controller's (the test cluster's stand-in), an Update of the status subresource.
    spec_writes = [f for f in service["metadata"]["managedFields"] if f.get("subresource") != "status"]
    assert {f["operation"] for f in spec_writes} == {"Apply"}, service["metadata"]["managedFields"]

    deployment = get(cluster, f"/apis/apps/v1{NS}/deployments/{FULLNAME}")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["readinessProbe"]["httpGet"]["port"] == "admin"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["runAsNonRoot"] is True
    f = flags(container["args"])
    assert f["--publish-service"] == [f"{NAMESPACE}/{FULLNAME}"]
    assert f["--admin-listen"] == ["0.0.0.0:10254", "[::]:10254"]
    assert pod["serviceAccountName"] == FULLNAME
    get(cluster, f"/api/v1{NS}/serviceaccounts/{FULLNAME}")

    ingress_class = get(cluster, "/apis/networking.k8s.io/v1/ingressclasses/duet")
    assert ingress_class["spec"]["controller"] == "duet.dev/ingress-controller"
    assert ingress_class["metadata"]["annotations"]["ingressclass.kubernetes.io/is-default-class"] == "true"

    assert rules_of(get(cluster, f"{RBAC}/clusterroles/{FULLNAME}")) == CLUSTER_RULES
    assert rules_of(get(cluster, f"{RBAC}{NS}/roles/{FULLNAME}-leader")) == LEASE_RULES
    subjects = [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}]
    assert get(cluster, f"{RBAC}/clusterrolebindings/{FULLNAME}")["subjects"] == subjects
    assert get(cluster, f"{RBAC}{NS}/rolebindings/{FULLNAME}-leader")["subjects"] == subjects

    assert get(cluster, f"/apis/policy/v1{NS}/poddisruptionbudgets/{FULLNAME}")["spec"]["maxUnavailable"] == 1
    monitor = get(cluster, f"/apis/monitoring.coreos.com/v1{NS}/servicemonitors/{FULLNAME}")
    metrics = get(cluster, f"/api/v1{NS}/services/{FULLNAME}-metrics")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= metrics["metadata"]["labels"].items()


# ---------------------------------------------------------------------------------------------
# The real duet, started with the installed Deployment's arguments and ServiceAccount


def app_objects(ns: str) -> list[dict]:
    """A Deployment of one echo pod behind a Service, and Ingresses of the chart's class, of
    another controller's class and of none (host names unique to the namespace)."""
    meta = lambda name: {"name": name, "namespace": ns}
    backend = {"service": {"name": "web", "port": {"number": 80}}}
    ingress = lambda name, spec: {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": meta(name), "spec": {
        **spec, "rules": [{"host": f"{name}.{ns}.test", "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": backend}]}}]}}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta("web"), "spec": {
            "replicas": 1, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{
                "name": "echo", "image": "duet.dev/echo", "ports": [{"name": "http", "containerPort": 8080}],
                "env": [{"name": "SERVICE_NAME", "value": "web"}]}]}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": meta("web"), "spec": {
            "ipFamilyPolicy": "PreferDualStack", "selector": {"app": "web"},
            "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}},
        ingress("ours", {"ingressClassName": "duet"}),
        ingress("theirs", {"ingressClassName": "other"}),
        ingress("classless", {}),
    ]


OTHER_CLASS = {"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass", "metadata": {"name": "other"},
               "spec": {"controller": "example.com/other-controller"}}


@pytest.mark.parametrize("default_class", [False, True], ids=["class-duet", "default-class"])
def test_duet_from_the_install_serves_the_chart_ingress_class_over_both_families(cluster, tmp_path, default_class):
    """Helm's install, then the real duet with the installed Deployment's arguments and a token
    of the chart's ServiceAccount (the real RBAC authorizer enforces the chart's rules), inside
    the cluster's namespace: it serves Ingresses of the chart's IngressClass to clients of both
    families (a pod of the client's family where the cluster has it), not another class's, and
    classless ones exactly when the chart marks its class the default; it copies the chart's
    LoadBalancer Service's addresses into their status, and on a single-stack cluster does not
    warn that the chart's Service has one family."""
    ns = "app-default" if default_class else "app-class"
    with helm_config(cluster, tmp_path) as cfg:
        install(cfg, {"ingressClass": {"default": default_class}})
        try:
            status, answer = cluster.request("POST", "/apis/networking.k8s.io/v1/ingressclasses", OTHER_CLASS)
            assert status in (201, 409), answer
            for obj in app_objects(ns):
                cluster.create(obj)
            with duet_from_deployment(cluster, tmp_path) as (duet, log):
                try:
                    check_served(cluster, ns, default_class, duet)
                    check_status_published(cluster, ns, duet)
                    assert "Publish Service problem" not in log.read_text()
                except BaseException:
                    print(log.read_text()[-4000:])
                    raise
        finally:
            cfg.uninstall(RELEASE)
            cluster.request("DELETE", f"/api/v1/namespaces/{ns}")


def check_served(cluster: RealCluster, ns: str, default_class: bool, duet):
    for fam, url in DUET_URLS.items():
        pod_family = fam if fam in cluster.families else cluster.families[0]

        def ours():
            assert duet.poll() is None, f"duet exited with {duet.returncode}"
            status, body = cluster.get_inside(url, f"ours.{ns}.test")
            return True if status == 200 else (status, body)

        until(60, f"ours.{ns}.test over {fam}", ours)
        echo = json.loads(cluster.get_inside(url, f"ours.{ns}.test")[1])
        assert echo["service"] == "web" and echo["pod"].startswith("web-"), echo
        assert echo["family"] == pod_family.lower(), (fam, echo)
        assert cluster.get_inside(url, f"theirs.{ns}.test")[0] == 404
        classless = cluster.get_inside(url, f"classless.{ns}.test")
        assert classless[0] == (200 if default_class else 404), classless


def check_status_published(cluster: RealCluster, ns: str, duet):
    """--publish-service as the chart wires it: once the chart's LoadBalancer Service has an
    address of each family, the leader copies both into the status of the Ingresses it serves."""
    path = f"/api/v1{NS}/services/{FULLNAME}"
    service = get(cluster, path)
    want = [{"ip": "192.0.2.10", "ipMode": "VIP"}, {"ip": "2001:db8::10", "ipMode": "VIP"}]
    service["status"] = {"loadBalancer": {"ingress": want}}
    status, answer = cluster.request("PUT", path + "/status", service)
    assert status == 200, answer

    def published():
        assert duet.poll() is None, f"duet exited with {duet.returncode}"
        got = get(cluster, f"/apis/networking.k8s.io/v1/namespaces/{ns}/ingresses/ours").get("status", {}).get("loadBalancer", {}).get("ingress")
        return True if [e["ip"] for e in got or []] == ["192.0.2.10", "2001:db8::10"] else got

    until(30, f"status.loadBalancer.ingress of {ns}/ours", published)
    theirs = get(cluster, f"/apis/networking.k8s.io/v1/namespaces/{ns}/ingresses/theirs")
    assert not theirs.get("status", {}).get("loadBalancer", {}).get("ingress")
