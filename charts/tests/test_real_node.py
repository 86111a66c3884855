"""The chart as users install it, on a REAL node (`duet-cluster up --real-node`: kubelet,
containerd and runc, CNI bridge, kube-proxy nftables and a stand-in load balancer), on a
dual-stack, an IPv6-primary dual-stack, an IPv4-only and an IPv6-only cluster.

Helm's install (helm-python-sdk, as test_install.py) with the DEFAULT values but the image
(duet.local/duet:dev, imported into containerd from an OCI archive of images/build.sh); then:

1. the Deployment's two replicas become Ready through the kubelet's own probes (on the
   IPv6-primary cluster the kubelet probes the pod's IPv6 address);
2. the security context holds in the RUNNING containers (crictl inspect gives their host pids:
   /proc/PID/status has uid and gid 65532, no effective capability, seccomp filter mode and
   no_new_privs; /proc/PID/mountinfo has a read-only root);
3. duet authenticates with its projected service-account token: one replica holds the release's
   leader Lease, and the leader writes the addresses of the chart's LoadBalancer Service (one per
   family of the cluster) into the status of an Ingress of the chart's IngressClass;
4. from the namespace OUTSIDE the node, a client of each family of the cluster reaches the echo
   pods behind that Ingress through the chart's LoadBalancer Service and duet, and the echo pod
   was reached over the client's family;
5. duet's own log in the pods (crictl logs) holds no warning or error;
6. the chart's DaemonSet with hostNetwork listens on the node's addresses of each family (from
   inside the node's network namespace: 10.244.0.1 and fd00:10:244::1).

The images hold the DEBUG binaries (target/debug/duet, target/debug/duet-echo): a release build
takes about 13 minutes here, a debug one is already there for the other tests. Per cluster the
test prints how long the install took to become Ready.

Needs root and what conformance/tests/real_node.rs needs (the node's binaries of
conformance/node/build.sh, nftables, iproute2, util-linux)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import subprocess
import tempfile
import time
import urllib.parse
from pathlib import Path

import pytest

from test_chart import FULLNAME, NAMESPACE, RELEASE, ROOT
from test_install import get, helm_config, install, until
from test_real_cluster import RealCluster, binary, enter_netns, family, http_get

STACKS = {
    "dual-stack": ([], ["IPv4", "IPv6"]),
    "ipv6-primary": (["--ipv6-primary"], ["IPv6", "IPv4"]),
    "ipv4": (["--single-stack=ipv4"], ["IPv4"]),
    "ipv6": (["--single-stack=ipv6"], ["IPv6"]),
}
NS = f"/namespaces/{NAMESPACE}"
APP = "app"
IMAGE_VALUES = {"image": {"repository": "duet.local/duet", "tag": "dev"}}
ECHO_IMAGE = "duet.local/duet-echo:dev"
# The node's own addresses (the CNI bridge's gateway of each family).
NODE_IPS = {"IPv4": "10.244.0.1", "IPv6": "fd00:10:244::1"}
CRICTL = ROOT / "conformance" / "node" / "bin" / "crictl"
READY_WITHIN = 180


def url(ip: str, port: int) -> str:
    return f"http://{ip}:{port}/" if family(ip) == "IPv4" else f"http://[{ip}]:{port}/"


@pytest.fixture(scope="session")
def images():
    """OCI archives of duet and the echo backend from the debug binaries."""
    out = ROOT / "target" / "images"
    out.mkdir(parents=True, exist_ok=True)
    built = []
    for name, bin_name, package, tag in (("duet", "duet", "controller", "duet.local/duet:dev"),
                                         ("echo", "duet-echo", "conformance", ECHO_IMAGE)):
        path = out / f"real-node-{name}.oci.tar"
        subprocess.run([ROOT / "images" / "build.sh", name, "--binary", binary(bin_name, package), "--tag", tag,
                        "--out", path], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        built.append(path)
    return built


class RealNode(RealCluster):
    """A cluster with a real node, the images loaded; `outside` runs calls in the namespace
    outside the node (where clients of LoadBalancer Services stand)."""

    def __init__(self, args: list[str], tmp: Path, images: list[Path]):
        image_args = [a for path in images for a in ("--image", str(path))]
        super().__init__(["--real-node", *image_args, *args], tmp)
        outside = (tmp / "outside-netns").read_text().strip()
        self.outside = concurrent.futures.ThreadPoolExecutor(max_workers=1, initializer=enter_netns, initargs=(outside,))

    def get_outside(self, url: str, host: str) -> tuple[int, str]:
        return self.outside.submit(http_get, url, host).result()

    def crictl(self, command: str, *args: str):
        socket = self.dir / "node" / "containerd" / "containerd.sock"
        run = subprocess.run([CRICTL, "--runtime-endpoint", f"unix://{socket}", command, "-o", "json", *args],
                             capture_output=True, text=True, timeout=30)
        assert run.returncode == 0, (command, args, run.stderr)
        return json.loads(run.stdout)

    def logs(self, container: str) -> str:
        """What the container wrote to stdout and stderr."""
        socket = self.dir / "node" / "containerd" / "containerd.sock"
        run = subprocess.run([CRICTL, "--runtime-endpoint", f"unix://{socket}", "logs", container],
                             capture_output=True, text=True, timeout=30)
        assert run.returncode == 0, (container, run.stderr)
        return run.stdout + "".join(line + "\n" for line in run.stderr.splitlines() if "crictl.yaml" not in line)

    def stop(self):
        self.outside.shutdown(wait=False)
        super().stop()


@pytest.fixture(scope="module", params=list(STACKS), ids=list(STACKS))
def node(request, images):
    args, families = STACKS[request.param]
    with tempfile.TemporaryDirectory(prefix="duet-chart-node-") as tmp:
        started = time.monotonic()
        running = RealNode(args, Path(tmp), images)
        running.stack = request.param
        running.families = families
        running.times = {"cluster up": time.monotonic() - started}
        try:
            yield running
        finally:
            running.stop()


def pods(cluster: RealCluster, selector: dict, namespace: str = NAMESPACE) -> list[dict]:
    query = urllib.parse.urlencode({"labelSelector": ",".join(f"{k}={v}" for k, v in selector.items())})
    return [p for p in get(cluster, f"/api/v1/namespaces/{namespace}/pods?{query}")["items"]
            if not p["metadata"].get("deletionTimestamp")]


def ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])


def ready_pods(cluster: RealCluster, path: str, n: int, families: list[str]):
    """A check for until(): the pods of the workload at `path` once n are Ready with an address of
    each of `families` (the kubelet's probes passed)."""
    workload = get(cluster, path)
    selector = workload["spec"]["selector"]["matchLabels"]

    def check():
        got = pods(cluster, selector, workload["metadata"]["namespace"])
        if len(got) == n and all(ready(p) for p in got) and all(
                [family(ip["ip"]) for ip in p["status"].get("podIPs") or []] == families for p in got):
            return True
        return [(p["metadata"]["name"], p["status"].get("phase"), p["status"].get("podIPs"),
                 [(c["type"], c["status"]) for c in p["status"].get("conditions") or []],
                 [s.get("state") for s in p["status"].get("containerStatuses") or []]) for p in got]

    return selector, check


def lb_ips(cluster: RealCluster, name: str, namespace: str = NAMESPACE):
    service = get(cluster, f"/api/v1/namespaces/{namespace}/services/{name}")
    return [e["ip"] for e in service.get("status", {}).get("loadBalancer", {}).get("ingress") or []]


def echo_objects(ns: str) -> list[dict]:
    meta = {"name": APP, "namespace": ns}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": {
            "replicas": 2, "selector": {"matchLabels": {"app": APP}},
            "template": {"metadata": {"labels": {"app": APP}}, "spec": {"containers": [{
                "name": "echo", "image": ECHO_IMAGE, "imagePullPolicy": "Never",
                "ports": [{"name": "http", "containerPort": 8080}],
                "env": [{"name": "HTTP_PORT", "value": "8080"}, {"name": "SERVICE_NAME", "value": APP},
                        {"name": "NAMESPACE", "value": ns},
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1}}]}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": {
            "ipFamilyPolicy": "PreferDualStack", "selector": {"app": APP},
            "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}},
        {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": meta, "spec": {
            "ingressClassName": "duet", "rules": [{"host": f"{APP}.{ns}.test", "http": {"paths": [
                {"path": "/", "pathType": "Prefix",
                 "backend": {"service": {"name": APP, "port": {"number": 80}}}}]}}]}},
    ]


def create_all(cluster: RealCluster, objects: list[dict]):
    paths = {"Namespace": "/api/v1/namespaces", "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
             "Service": "/api/v1/namespaces/{ns}/services",
             "Ingress": "/apis/networking.k8s.io/v1/namespaces/{ns}/ingresses"}
    for obj in objects:
        path = paths[obj["kind"]].format(ns=obj["metadata"].get("namespace"))
        status, body = cluster.request("POST", path, obj)
        assert status == 201, (obj["kind"], status, body.get("message", body))


def check_security_context(cluster: RealNode, pod_names: list[str]):
    """The duet containers as they run: crictl gives their host pids; the kernel's view of them."""
    for container in duet_containers(cluster, pod_names):
        pid = cluster.crictl("inspect", container["id"])["info"]["pid"]
        status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        status = {k: v.split() for k, v in status.items()}
        assert Path(f"/proc/{pid}/comm").read_text().strip() == "duet"
        assert status["Uid"] == ["65532"] * 4, status["Uid"]
        assert status["Gid"] == ["65532"] * 4, status["Gid"]
        for caps in ("CapEff", "CapPrm", "CapInh", "CapAmb"):
            assert status[caps] == ["0000000000000000"], (caps, status[caps])
        assert status["NoNewPrivs"] == ["1"]
        assert status["Seccomp"] == ["2"], "no seccomp filter (RuntimeDefault)"
        (root,) = [line.split() for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
                   if line.split()[4] == "/"]
        assert "ro" in root[5].split(","), f"root mount of {container['id']}: {root}"


def duet_containers(cluster: RealNode, pod_names: list[str]) -> list[dict]:
    """The running duet containers of these pods (containers of an earlier install may still be
    terminating)."""
    containers = [c for c in cluster.crictl("ps", "--name", "^duet$")["containers"]
                  if c["labels"].get("io.kubernetes.pod.namespace") == NAMESPACE
                  and c["labels"].get("io.kubernetes.pod.name") in pod_names]
    assert sorted(c["labels"]["io.kubernetes.pod.name"] for c in containers) == sorted(pod_names), containers
    return containers


def check_logs_clean(cluster: RealNode, pod_names: list[str]):
    """duet warned of nothing and hit no error in the pods (e.g. a refused API request of its
    service account, a write to the read-only root)."""
    for container in duet_containers(cluster, pod_names):
        log = cluster.logs(container["id"])
        assert " INFO " in log, log[-2000:]
        bad = [line for line in log.splitlines() if " WARN " in line or " ERROR " in line]
        assert not bad, "\n".join(bad)


@contextlib.contextmanager
def reported(cluster: RealNode, cfg, capsys):
    """Around a test's checks of its release: on a failure the pods' status is printed; the
    release is uninstalled in any case; after a pass the times the checks noted are printed."""
    try:
        yield
    except BaseException:
        for p in get(cluster, f"/api/v1{NS}/pods")["items"]:
            print(p["metadata"]["name"], json.dumps(p["status"])[:2000])
        raise
    finally:
        cfg.uninstall(RELEASE)
    with capsys.disabled():
        print(f"\n{cluster.stack}: " + ", ".join(
            f"{k} {v:.1f} s" if isinstance(v, float) else f"{k} {v}" for k, v in cluster.times.items()))


def test_default_install_on_a_real_node(node, tmp_path, capsys):
    cluster = node
    ns = "echo"
    deployment = f"/apis/apps/v1{NS}/deployments/{FULLNAME}"
    with helm_config(cluster, tmp_path) as cfg:
        started = time.monotonic()
        install(cfg, IMAGE_VALUES)
        _, check = ready_pods(cluster, deployment, 2, cluster.families)
        until(READY_WITHIN, "2 Ready duet pods", check)
        cluster.times["install to 2 Ready"] = time.monotonic() - started
        with reported(cluster, cfg, capsys):
            selector = get(cluster, deployment)["spec"]["selector"]["matchLabels"]
            names = [p["metadata"]["name"] for p in pods(cluster, selector)]

            # 2. The security context of the running containers.
            check_security_context(cluster, names)

            # 3. The service-account token: the Lease, then the status of an Ingress.
            lease = f"/apis/coordination.k8s.io/v1{NS}/leases/{FULLNAME}-leader"
            # duet's identity: POD_NAME, a dash and a random suffix.
            until(60, "a duet pod holds the leader Lease", lambda: True if any(
                (cluster.request("GET", lease)[1].get("spec", {}).get("holderIdentity") or "").startswith(f"{n}-")
                for n in names) else cluster.request("GET", lease))
            started = time.monotonic()
            create_all(cluster, echo_objects(ns))
            until(READY_WITHIN, "2 Ready echo pods", ready_pods(
                cluster, f"/apis/apps/v1/namespaces/{ns}/deployments/{APP}", 2, cluster.families)[1])
            cluster.times["echo to 2 Ready"] = time.monotonic() - started

            # 4. The chart's LoadBalancer Service: an address of each family.
            until(60, "an LB address per family", lambda: True if (
                [family(ip) for ip in lb_ips(cluster, FULLNAME)] == cluster.families) else lb_ips(cluster, FULLNAME))
            addresses = lb_ips(cluster, FULLNAME)
            ingress = f"/apis/networking.k8s.io/v1/namespaces/{ns}/ingresses/{APP}"

            def published():
                got = get(cluster, ingress).get("status", {}).get("loadBalancer", {}).get("ingress") or []
                return True if sorted(e["ip"] for e in got) == sorted(addresses) else got

            until(60, "the Ingress status lists the LB addresses", published)
            echo = [p["metadata"]["name"] for p in get(cluster, f"/api/v1/namespaces/{ns}/pods")["items"]]
            host = f"{APP}.{ns}.test"
            for ip in addresses:
                def served():
                    status, body = cluster.get_outside(url(ip, 80), host)
                    return True if status == 200 else (status, body)

                until(60, f"{host} through {ip} from outside the node", served)
                seen = set()
                for _ in range(8):
                    status, body = cluster.get_outside(url(ip, 80), host)
                    assert status == 200, (ip, status, body)
                    answer = json.loads(body)
                    assert answer["pod"] in echo and answer["namespace"] == ns, answer
                    assert answer["family"] == family(ip).lower(), (ip, answer)
                    seen.add(answer["pod"])
                cluster.times[f"served {family(ip)} by"] = sorted(seen)
            check_logs_clean(cluster, names)


def test_daemonset_with_host_network_serves_the_node_addresses(node, tmp_path, capsys):
    """controller.kind=DaemonSet, controller.hostNetwork=true: one duet pod in the node's own
    network namespace, Ready through the kubelet's probes of the node's address, listening on
    the node's address of each family of the cluster (10.244.0.1, fd00:10:244::1)."""
    cluster = node
    ns = "echo-hostnet"
    daemonset = f"/apis/apps/v1{NS}/daemonsets/{FULLNAME}"
    with helm_config(cluster, tmp_path) as cfg:
        started = time.monotonic()
        install(cfg, {**IMAGE_VALUES, "controller": {"kind": "DaemonSet", "hostNetwork": True}})
        with reported(cluster, cfg, capsys):
            assert cluster.request("GET", f"/apis/apps/v1{NS}/deployments/{FULLNAME}")[0] == 404
            selector, check = ready_pods(cluster, daemonset, 1, cluster.families)
            until(READY_WITHIN, "1 Ready duet pod on the host network", check)
            cluster.times = {"DaemonSet install to Ready": time.monotonic() - started}
            (pod,) = pods(cluster, selector)
            assert pod["spec"]["hostNetwork"] is True
            host_ips = [ip["ip"] for ip in pod["status"]["hostIPs"]]
            assert host_ips == [NODE_IPS[f] for f in cluster.families], host_ips
            # On the host network the pod's addresses are the node's.
            assert [ip["ip"] for ip in pod["status"]["podIPs"]] == host_ips
            check_security_context(cluster, [pod["metadata"]["name"]])

            create_all(cluster, echo_objects(ns))
            until(READY_WITHIN, "2 Ready echo pods", ready_pods(
                cluster, f"/apis/apps/v1/namespaces/{ns}/deployments/{APP}", 2, cluster.families)[1])
            echo = [p["metadata"]["name"] for p in get(cluster, f"/api/v1/namespaces/{ns}/pods")["items"]]
            host = f"{APP}.{ns}.test"
            for ip in host_ips:
                port = 8080  # controller.containerPorts.http: on the node itself

                def served():
                    status, body = cluster.get_inside(url(ip, port), host)
                    return True if status == 200 else (status, body)

                until(60, f"{host} at {ip}:{port} inside the node", served)
                status, body = cluster.get_inside(url(ip, port), host)
                answer = json.loads(body)
                assert answer["pod"] in echo and answer["family"] == family(ip).lower(), (ip, answer)
                status, body = cluster.get_inside(url(ip, 10254) + "readyz", host)
                assert status == 200, (ip, status, body)
                cluster.times[f"served at {ip}"] = answer["pod"]
            check_logs_clean(cluster, [pod["metadata"]["name"]])
