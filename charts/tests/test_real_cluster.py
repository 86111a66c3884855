"""The chart's default values against the REAL kube-apiserver v1.37 (conformance/cluster, started
with `duet-cluster up`) on a dual-stack, an IPv4-only and an IPv6-only cluster: every rendered
object is created through the API and the Service gets cluster IPs of exactly the cluster's
families (a listed family the cluster lacks is refused: "spec.ipFamilies[1]: Invalid value:
"IPv6": not configured on this cluster"). The cluster fixture, the forwarder for clients outside
the namespace and duet started from the installed Deployment serve test_install.py too (Helm's
install and uninstall, and duet against that install).

The cluster runs in a network namespace of its own; this test talks to it from a thread that
joined that namespace (setns(2) through libc: Python 3.11 has no os.setns)."""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import ctypes
import ipaddress
import json
import os
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from test_chart import FULLNAME, NAMESPACE, ROOT, render

CLONE_NEWNET = 0x40000000


def binary(name: str, package: str) -> Path:
    path = ROOT / "target" / "debug" / name
    if not path.exists():
        subprocess.run(["cargo", "build", "--quiet", "--locked", "-p", package, "--bin", name], cwd=ROOT, check=True)
    return path

# kind -> (API prefix, plural, namespaced) for what the default values render.
KINDS = {
    "Namespace": ("/api/v1", "namespaces", False),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "Service": ("/api/v1", "services", True),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets", True),
    "IngressClass": ("/apis/networking.k8s.io/v1", "ingressclasses", False),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    "Ingress": ("/apis/networking.k8s.io/v1", "ingresses", True),
}

STACKS = {
    "dual-stack": ([], ["IPv4", "IPv6"]),
    "ipv4": (["--single-stack=ipv4"], ["IPv4"]),
    "ipv6": (["--single-stack=ipv6"], ["IPv6"]),
}


def enter_netns(path: str):
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns({path})")
    finally:
        os.close(fd)


class RealCluster:
    """`duet-cluster up` in the background; requests go through one thread inside its namespace."""

    def __init__(self, args: list[str], tmp: Path):
        self.dir = tmp
        self.log = open(tmp / "up.log", "w")
        self.process = subprocess.Popen(
            [binary("duet-cluster", "conformance"), "up", "--dir", tmp, *args],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 300
        while not (tmp / "ready").exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"duet-cluster up failed: {(tmp / 'up.log').read_text()}")
            time.sleep(0.1)
        self.control_plane = (tmp / "ready").read_text()
        config = yaml.safe_load((tmp / "kubeconfig").read_text())
        self.url = config["clusters"][0]["cluster"]["server"]
        user = config["users"][0]["user"]
        pem = {}
        for key in ("client-certificate-data", "client-key-data"):
            pem[key] = tmp / key
            pem[key].write_bytes(base64.b64decode(user[key]))
        ca = base64.b64decode(config["clusters"][0]["cluster"]["certificate-authority-data"]).decode()
        self.tls = ssl.create_default_context(cadata=ca)
        self.tls.load_cert_chain(pem["client-certificate-data"], pem["client-key-data"])
        netns = (tmp / "netns").read_text().strip()
        self.inside = concurrent.futures.ThreadPoolExecutor(max_workers=1, initializer=enter_netns, initargs=(netns,))

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        return self.inside.submit(self._request, method, path, body).result()

    def _request(self, method: str, path: str, body: dict | None) -> tuple[int, dict]:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        req = urllib.request.Request(self.url + path, method=method, data=data, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=10, context=self.tls) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"{}")

    def create(self, obj: dict) -> dict:
        prefix, plural, namespaced = KINDS[obj["kind"]]
        ns = f"/namespaces/{obj['metadata'].get('namespace', NAMESPACE)}" if namespaced else ""
        status, body = self.request("POST", f"{prefix}{ns}/{plural}", obj)
        assert status == 201, f"{obj['kind']} {obj['metadata']['name']}: {status} {body.get('message', body)}"
        return body

    def host_kubeconfig(self, fam: str, path: Path) -> Path:
        """A kubeconfig for clients outside the namespace (Helm's Go library runs on threads of
        its own, which cannot join it): the admin kubeconfig with a server on the host's
        loopback of `fam`, forwarded byte for byte to port 6443 of the same loopback inside."""
        host = "127.0.0.1" if fam == "IPv4" else "::1"
        listener = socket.create_server((host, 0), family=socket.AF_INET if fam == "IPv4" else socket.AF_INET6)
        self.listeners = getattr(self, "listeners", []) + [listener]
        threading.Thread(target=self._forward, args=(listener, host), daemon=True).start()
        config = yaml.safe_load((self.dir / "kubeconfig").read_text())
        port = listener.getsockname()[1]
        config["clusters"][0]["cluster"]["server"] = f"https://{host}:{port}" if fam == "IPv4" else f"https://[{host}]:{port}"
        path.write_text(yaml.safe_dump(config))
        return path

    def _forward(self, listener: socket.socket, host: str):
        while True:
            try:
                client, _ = listener.accept()
                server = self.inside.submit(socket.create_connection, (host, 6443), 10).result()
            except (OSError, RuntimeError):
                if listener.fileno() == -1:
                    return
                continue
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=pipe, args=(src, dst), daemon=True).start()

    def get_inside(self, url: str, host: str) -> tuple[int, str]:
        """GET url with Host: host from inside the namespace (where duet and the pods listen)."""
        return self.inside.submit(http_get, url, host).result()

    def stop(self):
        for listener in getattr(self, "listeners", []):
            listener.close()
        if hasattr(self, "inside"):
            self.inside.shutdown(wait=False)
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


def pipe(src: socket.socket, dst: socket.socket):
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


@pytest.fixture(scope="module", params=list(STACKS), ids=list(STACKS))
def cluster(request):
    args, families = STACKS[request.param]
    with tempfile.TemporaryDirectory(prefix="duet-chart-cluster-") as tmp:
        running = RealCluster(args, Path(tmp))
        running.families = families
        yield running
        running.stop()


def family(ip: str) -> str:
    return "IPv4" if ipaddress.ip_address(ip).version == 4 else "IPv6"


@pytest.fixture(scope="module")
def installed(cluster):
    """The chart's default values rendered by Helm and created object by object."""
    objects = [o for o in render() if o["kind"] in KINDS]
    assert {o["kind"] for o in objects} >= {"Service", "Deployment", "IngressClass", "ClusterRole"}
    cluster.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    for obj in objects:
        obj.pop("__template", None)
        cluster.create(obj)
    return cluster


def test_default_values_install_into_the_real_api_server(installed):
    cluster = installed
    assert cluster.control_plane.startswith("kube-apiserver v1.37.")
    status, service = cluster.request("GET", f"/api/v1/namespaces/{NAMESPACE}/services/{FULLNAME}")
    assert status == 200
    spec = service["spec"]
    assert spec["ipFamilyPolicy"] == "PreferDualStack"
    assert spec["ipFamilies"] == cluster.families
    assert [family(ip) for ip in spec["clusterIPs"]] == cluster.families
    assert spec["clusterIP"] == spec["clusterIPs"][0]
    status, deployment = cluster.request("GET", f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{FULLNAME}")
    assert status == 200 and deployment["spec"]["replicas"] == 2


# ---------------------------------------------------------------------------------------------
# The real duet, started with the installed Deployment's arguments and its ServiceAccount's
# token (so the real RBAC authorizer enforces the chart's rules), inside the cluster's namespace
# (test_install.py runs it against Helm's install).


def service_account_kubeconfig(cluster: RealCluster, path: Path):
    """A kubeconfig with a token of the chart's ServiceAccount (TokenRequest API)."""
    status, answer = cluster.request(
        "POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{FULLNAME}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}})
    assert status == 201, answer
    config = yaml.safe_load((cluster.dir / "kubeconfig").read_text())
    config["users"][0]["user"] = {"token": answer["status"]["token"]}
    path.write_text(yaml.safe_dump(config))


def http_get(url: str, host: str) -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"Host": host})
    try:
        with urllib.request.urlopen(req, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError as error:
        return 0, str(error)


# duet's listeners inside the namespace (the test's own: fixed ports cannot be taken by anyone).
DUET_URLS = {"IPv4": "http://127.0.0.1:18080/", "IPv6": "http://[::1]:18080/"}


@contextlib.contextmanager
def duet_from_deployment(cluster: RealCluster, tmp_path: Path):
    """duet with the installed Deployment's arguments (listeners moved to loopback) and the
    chart's ServiceAccount, running inside the namespace until the block ends; yields the
    process and its log's path."""
    kubeconfig = tmp_path / "duet.kubeconfig"
    service_account_kubeconfig(cluster, kubeconfig)
    status, deployment = cluster.request("GET", f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{FULLNAME}")
    assert status == 200, deployment
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = [a for a in container["args"] if not a.startswith(("--http-listen", "--https-listen", "--admin-listen"))]
    args += ["--http-listen=127.0.0.1:18080", "--http-listen=[::1]:18080", "--admin-listen=127.0.0.1:18254",
             "--https-listen=127.0.0.1:18443", f"--kubeconfig={kubeconfig}"]
    env = {"PATH": "/usr/bin:/bin", "DUET_LOG": "info", "POD_NAME": f"{FULLNAME}-0", "POD_NAMESPACE": NAMESPACE}
    netns = (cluster.dir / "netns").read_text().strip()
    log_path = tmp_path / "duet.log"
    with open(log_path, "w") as log:
        duet = subprocess.Popen(["setpriv", "--pdeathsig", "KILL", "nsenter", f"--net={netns}", "--",
                                 binary("duet", "controller"), *args], stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            yield duet, log_path
        finally:
            duet.terminate()
            duet.wait(timeout=40)
