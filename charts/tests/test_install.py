"""Installs the duet chart with Helm's own install action (helm-python-sdk, server-side apply) into
the test Kubernetes API server (`duet-apiserver`, from conformance/), over IPv4 and IPv6
loopback, and reads the objects back from the server: what a cluster would store, not what the
templates say.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import helm_python as helm
import pytest
import yaml
from helm_python import _native

from test_chart import CHART, CLUSTER_RULES, FULLNAME, LEASE_RULES, NAMESPACE, RELEASE, ROOT, flags

def binary(name: str, package: str) -> Path:
    path = ROOT / "target" / "debug" / name
    if not path.exists():
        subprocess.run(["cargo", "build", "--quiet", "--locked", "-p", package, "--bin", name], cwd=ROOT, check=True)
    return path


class ApiServer:
    """A running duet-apiserver with the kubeconfig it wrote."""

    def __init__(self, listen: str, tmp: Path):
        self.kubeconfig = tmp / "kubeconfig"
        self.process = subprocess.Popen(
            [binary("duet-apiserver", "conformance"), "--listen", listen, "--kubeconfig", self.kubeconfig],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not self.kubeconfig.exists():
            if self.process.poll() is not None:
                raise RuntimeError(f"duet-apiserver exited: {self.process.stdout.read()}")
            time.sleep(0.02)
        config = yaml.safe_load(self.kubeconfig.read_text())
        self.url = config["clusters"][0]["cluster"]["server"]
        self.token = config["users"][0]["user"].get("token")

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, method=method, data=data, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"{}")

    def get(self, path: str) -> dict:
        status, body = self.request("GET", path)
        assert status == 200, (path, status, body)
        return body

    def stop(self):
        self.process.kill()
        self.process.wait(timeout=10)


@pytest.fixture(params=["127.0.0.1:0", "[::1]:0"], ids=["ipv4", "ipv6"])
def apiserver(request, tmp_path):
    server = ApiServer(request.param, tmp_path)
    yield server
    server.stop()


def install(cfg: helm.Config, values: dict) -> dict:
    """`helm install` into the test server. OpenAPI validation is off because the test server
    serves no OpenAPI documents (test_chart.py checks the objects against the real schemas); the
    rest is Helm's real install path, server-side apply included. (helm-python-sdk does not expose
    that option, so this calls its native function with the documented option key.)"""
    handle, ref = cfg._chart_args(CHART)
    payload = _native.call_string(
        "helm_install",
        cfg._raw(),
        cfg._context_arg(None),
        handle,
        ref,
        RELEASE,
        json.dumps(values),
        json.dumps({"namespace": NAMESPACE, "disable_openapi_validation": True}),
    )
    return json.loads(payload)


def rules_of(role: dict) -> set:
    return {
        (group, resource, verb, name)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
        for name in rule.get("resourceNames") or [None]
    }


def test_helm_install_into_the_test_api_server(apiserver):
    status, _ = apiserver.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    assert status == 201
    with helm.Config(namespace=NAMESPACE, kubeconfig_path=str(apiserver.kubeconfig), storage_driver="memory") as cfg:
        release = install(cfg, {"ingressClass": {"default": True}, "metrics": {"serviceMonitor": {"enabled": True}}})
        assert (release["name"], release["namespace"], release["status"]) == (RELEASE, NAMESPACE, "deployed")
        check_installed_objects(apiserver)
        cfg.uninstall(RELEASE)
    for path in (f"/api/v1/namespaces/{NAMESPACE}/services/{FULLNAME}", "/apis/networking.k8s.io/v1/ingressclasses/duet", f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{FULLNAME}"):
        assert apiserver.request("GET", path)[0] == 404, f"{path} left after helm uninstall"


def check_installed_objects(apiserver: ApiServer):
    ns = f"/namespaces/{NAMESPACE}"
    service = apiserver.get(f"/api/v1{ns}/services/{FULLNAME}")
    assert service["spec"]["type"] == "LoadBalancer"
    assert service["spec"]["ipFamilyPolicy"] == "PreferDualStack"
    assert service["spec"]["ipFamilies"] == ["IPv4", "IPv6"]
    assert {p["port"]: p["targetPort"] for p in service["spec"]["ports"]} == {80: "http", 443: "https"}
    assert service["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE

    deployment = apiserver.get(f"/apis/apps/v1{ns}/deployments/{FULLNAME}")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["runAsNonRoot"] is True
    f = flags(container["args"])
    assert f["--publish-service"] == [f"{NAMESPACE}/{service['metadata']['name']}"]
    assert f["--admin-listen"] == ["0.0.0.0:10254", "[::]:10254"]
    assert pod["serviceAccountName"] == FULLNAME
    apiserver.get(f"/api/v1{ns}/serviceaccounts/{FULLNAME}")

    ingress_class = apiserver.get("/apis/networking.k8s.io/v1/ingressclasses/duet")
    assert ingress_class["spec"]["controller"] == "duet.dev/ingress-controller"
    assert ingress_class["metadata"]["annotations"]["ingressclass.kubernetes.io/is-default-class"] == "true"

    rbac = "/apis/rbac.authorization.k8s.io/v1"
    assert rules_of(apiserver.get(f"{rbac}/clusterroles/{FULLNAME}")) == CLUSTER_RULES
    assert rules_of(apiserver.get(f"{rbac}{ns}/roles/{FULLNAME}-leader")) == LEASE_RULES
    binding = apiserver.get(f"{rbac}/clusterrolebindings/{FULLNAME}")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}]
    apiserver.get(f"{rbac}{ns}/rolebindings/{FULLNAME}-leader")

    assert apiserver.get(f"/apis/policy/v1{ns}/poddisruptionbudgets/{FULLNAME}")["spec"]["maxUnavailable"] == 1
    monitor = apiserver.get(f"/apis/monitoring.coreos.com/v1{ns}/servicemonitors/{FULLNAME}")
    metrics = apiserver.get(f"/api/v1{ns}/services/{FULLNAME}-metrics")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= metrics["metadata"]["labels"].items()
