"""Installs the duet chart with Helm's own install action (helm-python-sdk, server-side apply) into
the test Kubernetes API server (`duet-apiserver`, from conformance/), over IPv4 and IPv6
loopback, and reads the objects back from the server: what a cluster would store, not what the
templates say.
"""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import threading
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
    # No families listed: the cluster gives its own (test_real_cluster.py checks what a real API
    # server allocates on single-stack and dual-stack clusters).
    assert "ipFamilies" not in service["spec"]
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


# ---------------------------------------------------------------------------------------------
# The real duet, started with the installed Deployment's arguments against the same server


class Backend(http.server.BaseHTTPRequestHandler):
    """A one-pod backend on loopback that names the family it was reached over."""

    def do_GET(self):
        body = f"backend via {'ipv6' if ':' in self.client_address[0] else 'ipv4'}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class Server6(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6


def free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def free_port_both() -> int:
    """A port free on both 127.0.0.1 and [::1] right now (other processes share this machine)."""
    for _ in range(50):
        port = free_port("127.0.0.1")
        try:
            with socket.socket(socket.AF_INET6) as s:
                s.bind(("::1", port))
            return port
        except OSError:
            continue
    raise RuntimeError("no port free on both loopback families")


def start_backends() -> list[http.server.ThreadingHTTPServer]:
    """The backend on 127.0.0.1 and [::1] with one port, retried when another process takes it."""
    for _ in range(20):
        v4 = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Backend)
        try:
            v6 = Server6(("::1", v4.server_address[1]), Backend)
        except OSError:
            v4.server_close()
            continue
        for server in (v4, v6):
            threading.Thread(target=server.serve_forever, daemon=True).start()
        return [v4, v6]
    raise RuntimeError("no port free on both loopback families")


def get(url: str, host: str) -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"Host": host})
    try:
        with urllib.request.urlopen(req, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError as error:
        return 0, str(error)


def poll(deadline_s: float, what: str, check, process: subprocess.Popen | None = None):
    deadline = time.monotonic() + deadline_s
    last = None
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            pytest.fail(f"{what}: duet exited with {process.returncode}")
        last = check()
        if last is True:
            return
        time.sleep(0.05)
    pytest.fail(f"{what}: still {last!r} after {deadline_s} s")


def app_objects(backend_port: int) -> list[tuple[str, dict]]:
    meta = lambda name, **extra: {"name": name, "namespace": "app", **extra}
    backend = lambda: {"service": {"name": "web", "port": {"number": 80}}}
    rule = lambda host: {"host": host, "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": backend()}]}}
    return [
        ("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "app"}}),
        ("/api/v1/namespaces/app/services", {"apiVersion": "v1", "kind": "Service", "metadata": meta("web"),
            "spec": {"ipFamilyPolicy": "PreferDualStack", "ipFamilies": ["IPv4", "IPv6"], "clusterIPs": ["10.96.0.10", "fd00::10"],
                     "ports": [{"name": "http", "port": 80, "targetPort": backend_port, "protocol": "TCP"}]}}),
        ("/apis/discovery.k8s.io/v1/namespaces/app/endpointslices", {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": meta("web-v4", labels={"kubernetes.io/service-name": "web"}), "addressType": "IPv4",
            "ports": [{"name": "http", "port": backend_port, "protocol": "TCP"}],
            "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True},
                           "targetRef": {"kind": "Pod", "namespace": "app", "name": "web-0", "uid": "00000000-0000-4000-8000-000000000001"}}]}),
        ("/apis/discovery.k8s.io/v1/namespaces/app/endpointslices", {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": meta("web-v6", labels={"kubernetes.io/service-name": "web"}), "addressType": "IPv6",
            "ports": [{"name": "http", "port": backend_port, "protocol": "TCP"}],
            "endpoints": [{"addresses": ["::1"], "conditions": {"ready": True},
                           "targetRef": {"kind": "Pod", "namespace": "app", "name": "web-0", "uid": "00000000-0000-4000-8000-000000000001"}}]}),
        ("/apis/networking.k8s.io/v1/ingressclasses", {"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
            "metadata": {"name": "other"}, "spec": {"controller": "example.com/other-controller"}}),
        ("/apis/networking.k8s.io/v1/namespaces/app/ingresses", {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": meta("ours"), "spec": {"ingressClassName": "duet", "rules": [rule("ours.test")]}}),
        ("/apis/networking.k8s.io/v1/namespaces/app/ingresses", {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": meta("theirs"), "spec": {"ingressClassName": "other", "rules": [rule("theirs.test")]}}),
        ("/apis/networking.k8s.io/v1/namespaces/app/ingresses", {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": meta("classless"), "spec": {"rules": [rule("classless.test")]}}),
    ]


@pytest.mark.parametrize("default_class", [False, True], ids=["class-duet", "default-class"])
def test_duet_serves_the_chart_ingress_class_from_the_api_server(apiserver, tmp_path, default_class):
    """The chart installed into the test API server, then the real duet started with the
    installed Deployment's own arguments (listeners moved to free loopback ports) against that
    server: it serves Ingresses of the chart's IngressClass over both families, not another
    class's, and classless ones exactly when the chart marks its class the default."""
    apiserver.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    with helm.Config(namespace=NAMESPACE, kubeconfig_path=str(apiserver.kubeconfig), storage_driver="memory") as cfg:
        assert install(cfg, {"ingressClass": {"default": default_class}})["status"] == "deployed"

    servers = start_backends()
    backend_port = servers[0].server_address[1]
    for path, body in app_objects(backend_port):
        status, answer = apiserver.request("POST", path, body)
        assert status == 201, (path, status, answer)

    deployment = apiserver.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{FULLNAME}")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    chart_args = [a for a in container["args"] if not a.startswith(("--http-listen", "--https-listen", "--admin-listen"))]
    env = {"PATH": "/usr/bin:/bin", "DUET_LOG": "info", "POD_NAME": "edge-duet-0", "POD_NAMESPACE": NAMESPACE}
    try:
        # Another process on this shared machine may take a chosen port before duet binds it:
        # start again on fresh ports when duet exits before it is ready.
        for attempt in range(5):
            http_port, admin_port, https_port = free_port_both(), free_port("127.0.0.1"), free_port("127.0.0.1")
            args = chart_args + [f"--http-listen=127.0.0.1:{http_port}", f"--http-listen=[::1]:{http_port}",
                                 f"--admin-listen=127.0.0.1:{admin_port}", f"--https-listen=127.0.0.1:{https_port}",
                                 f"--kubeconfig={apiserver.kubeconfig}",
                                 # The test's pods listen on loopback, which Kubernetes mode refuses
                                 # without this test-only flag.
                                 "--allow-loopback-endpoints"]
            log = open(tmp_path / "duet.log", "w")
            duet = subprocess.Popen([binary("duet", "controller"), *args], stdout=log, stderr=subprocess.STDOUT, env=env)
            if wait_ready(admin_port, duet):
                break
            log.close()
        else:
            pytest.fail("duet did not start in 5 attempts")
        try:
            check_served(http_port, admin_port, default_class, duet)
            check_status_published(apiserver, duet)
        except BaseException:
            log.flush()
            print((tmp_path / "duet.log").read_text()[-4000:])
            raise
        finally:
            duet.terminate()
            duet.wait(timeout=40)
            log.close()
    finally:
        for server in servers:
            server.shutdown()


def wait_ready(admin_port: int, duet: subprocess.Popen, deadline_s: float = 20) -> bool:
    """Polls /readyz until 200 (True) or duet exits (False)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if duet.poll() is not None:
            return False
        if get(f"http://127.0.0.1:{admin_port}/readyz", "admin")[0] == 200:
            return True
        time.sleep(0.05)
    pytest.fail(f"duet not ready after {deadline_s} s")


def poll_get(url: str, host: str, expected: tuple[int, str] | int, deadline_s: float, process: subprocess.Popen):
    """Polls until GET url (Host: host) answers as expected: a status, or a status and a body."""
    def check():
        answer = get(url, host)
        return True if answer == expected or answer[0] == expected else answer

    poll(deadline_s, f"GET {url} Host: {host}", check, process)


def check_served(http_port: int, admin_port: int, default_class: bool, duet: subprocess.Popen):
    for base, family in ((f"http://127.0.0.1:{http_port}", "ipv4"), (f"http://[::1]:{http_port}", "ipv6")):
        poll_get(base + "/", "ours.test", (200, f"backend via {family}\n"), 5, duet)
        assert get(base + "/", "theirs.test")[0] == 404
        classless = get(base + "/", "classless.test")
        assert classless[0] == (200 if default_class else 404), classless


def check_status_published(apiserver: ApiServer, duet: subprocess.Popen):
    """--publish-service as the chart wires it: once the chart's LoadBalancer Service has an
    address of each family, the leader copies both into the status of the Ingress it serves."""
    path = f"/api/v1/namespaces/{NAMESPACE}/services/{FULLNAME}"
    service = apiserver.get(path)
    service["status"] = {"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}, {"ip": "2001:db8::10"}]}}
    status, answer = apiserver.request("PUT", path + "/status", service)
    assert status == 200, answer
    want = [{"ip": "192.0.2.10"}, {"ip": "2001:db8::10"}]

    def published():
        ingress = apiserver.get("/apis/networking.k8s.io/v1/namespaces/app/ingresses/ours")
        got = ingress.get("status", {}).get("loadBalancer", {}).get("ingress")
        return True if got == want else got

    poll(20, "status.loadBalancer.ingress of app/ours", published, duet)
    theirs = apiserver.get("/apis/networking.k8s.io/v1/namespaces/app/ingresses/theirs")
    assert not theirs.get("status", {}).get("loadBalancer", {}).get("ingress")
