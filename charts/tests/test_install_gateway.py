"""`gatewayAPI.enabled=true` installed by Helm's own library into the REAL kube-apiserver v1.37
with the Gateway API standard CRDs (`duet-cluster up --gateway-api`, dual-stack), and the real
duet started with the installed Deployment's arguments and a token of the chart's ServiceAccount:
the real RBAC authorizer enforces the chart's Gateway rules on every call the Gateway controller
makes. duet accepts the chart's GatewayClass controller name, gives a Gateway its dual-stack
LoadBalancer Service and EndpointSlices of the release's pods (the stand-in kubelet runs them;
their addresses live in the cluster's namespace, where duet binds the pod ports), writes the
Gateway's and the HTTPRoute's status, and serves the route through the load balancer's IPv4 and
IPv6 addresses, with the rules granted cluster-wide and, under `controller.watchNamespaces`, in
the watched namespace only. Nothing the chart forgot to grant can hide: any `forbidden` answer in
duet's log fails the test.
"""

from __future__ import annotations

import ipaddress
import json
import tempfile
from pathlib import Path

import pytest

from test_chart import NAMESPACE, RELEASE
from test_install import app_objects, get, helm_config, install, until
from test_real_cluster import RealCluster, duet_from_deployment

GW = "/apis/gateway.networking.k8s.io/v1"


@pytest.fixture(scope="module")
def gateway_cluster():
    with tempfile.TemporaryDirectory(prefix="duet-chart-gateway-") as tmp:
        running = RealCluster(["--gateway-api"], Path(tmp))
        running.families = ["IPv4", "IPv6"]
        yield running
        running.stop()


def create(cluster: RealCluster, path: str, obj: dict):
    status, answer = cluster.request("POST", path, obj)
    assert status == 201, (path, status, answer.get("message", answer))


def condition(obj: dict, kind: str) -> dict:
    """A condition of an object's status, or of a route's status entry for one parent."""
    conditions = (obj.get("status") or {}).get("conditions") or obj.get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), {})


def true(obj: dict, *kinds: str):
    """True when every condition is True, else what they are."""
    got = {k: condition(obj, k).get("status") for k in kinds}
    return True if all(v == "True" for v in got.values()) else got


@pytest.mark.parametrize("scoped", [False, True], ids=["cluster-wide", "watch-namespaces"])
def test_gateway_values_let_duet_program_and_serve_a_gateway(gateway_cluster, tmp_path, scoped):
    """Cluster-wide, and with controller.watchNamespaces: the Gateway rules then come by a
    RoleBinding in the watched namespace only (GatewayClasses and Namespaces stay cluster-wide),
    and duet's Gateway watches must stay inside it."""
    cluster = gateway_cluster
    app = "app-gw-scoped" if scoped else "app-gw"
    values = {"gatewayAPI": {"enabled": True}}
    if scoped:
        values["controller"] = {"watchNamespaces": [app]}
    # The namespace first: the chart's RoleBinding goes into it.
    objects = [o for o in app_objects(app) if o["kind"] != "Ingress"]
    cluster.create(objects[0])
    with helm_config(cluster, tmp_path) as cfg:
        install(cfg, values)
        try:
            for obj in objects[1:]:
                cluster.create(obj)
            create(cluster, f"{GW}/gatewayclasses", {
                "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass", "metadata": {"name": app},
                "spec": {"controllerName": "duet.dev/gateway-controller"}})
            create(cluster, f"{GW}/namespaces/{app}/gateways", {
                "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
                "metadata": {"name": "edge", "namespace": app},
                "spec": {"gatewayClassName": app, "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}})
            create(cluster, f"{GW}/namespaces/{app}/httproutes", {
                "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                "metadata": {"name": "web", "namespace": app},
                "spec": {"parentRefs": [{"name": "edge"}], "hostnames": [f"gateway.{app}.test"],
                         "rules": [{"backendRefs": [{"name": "web", "port": 80}]}]}})
            with duet_from_deployment(cluster, tmp_path) as (duet, log):
                try:
                    check_programmed_and_served(cluster, duet, app)
                    forbidden = [line for line in log.read_text().splitlines() if "forbidden" in line.lower()]
                    assert not forbidden, forbidden[:5]
                except BaseException:
                    print(log.read_text()[-6000:])
                    raise
        finally:
            cfg.uninstall(RELEASE)
            cluster.request("DELETE", f"/api/v1/namespaces/{app}")


def check_programmed_and_served(cluster: RealCluster, duet, app: str):
    def alive():
        assert duet.poll() is None, f"duet exited with {duet.returncode}"

    def class_accepted():
        alive()
        return true(get(cluster, f"{GW}/gatewayclasses/{app}"), "Accepted")

    until(60, f"GatewayClass {app} Accepted", class_accepted)

    def gateway_programmed():
        alive()
        gateway = get(cluster, f"{GW}/namespaces/{app}/gateways/edge")
        addresses = [a["value"] for a in gateway.get("status", {}).get("addresses") or []]
        state = true(gateway, "Accepted", "Programmed")
        return True if state is True and len(addresses) == 2 else (state, addresses)

    until(90, "Gateway edge Accepted, Programmed, with an address of each family", gateway_programmed)
    gateway = get(cluster, f"{GW}/namespaces/{app}/gateways/edge")
    addresses = [a["value"] for a in gateway["status"]["addresses"]]
    assert [ipaddress.ip_address(a).version for a in addresses] == [4, 6], addresses

    # The Gateway's Service and the EndpointSlices duet wrote: the release's ready pods.
    service = get(cluster, f"/api/v1/namespaces/{app}/services/duet-edge")
    assert service["spec"]["type"] == "LoadBalancer"
    assert service["metadata"]["ownerReferences"][0]["name"] == "edge"
    def slices_of_release_pods():
        alive()
        slices = get(cluster, f"/apis/discovery.k8s.io/v1/namespaces/{app}/endpointslices"
                              "?labelSelector=kubernetes.io/service-name=duet-edge")["items"]
        pods = get(cluster, f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
        pod_ips = {ip["ip"] for pod in pods for ip in pod.get("status", {}).get("podIPs") or []}
        by_family = {s["addressType"]: {a for e in s.get("endpoints") or [] for a in e["addresses"]} for s in slices}
        ok = set(by_family) == {"IPv4", "IPv6"} and all(by_family.values()) and set().union(*by_family.values()) <= pod_ips
        return True if ok else (by_family, pod_ips)

    until(90, "EndpointSlices of both families listing the release's pods", slices_of_release_pods)

    def route_accepted():
        alive()
        route = get(cluster, f"{GW}/namespaces/{app}/httproutes/web")
        parents = route.get("status", {}).get("parents") or []
        return True if parents and true(parents[0], "Accepted", "ResolvedRefs") is True else parents

    until(60, "HTTPRoute web Accepted with resolved refs", route_accepted)

    for address in addresses:
        ip = ipaddress.ip_address(address)
        url = f"http://{address}/" if ip.version == 4 else f"http://[{address}]/"

        def served():
            alive()
            status, body = cluster.get_inside(url, f"gateway.{app}.test")
            return True if status == 200 else (status, body[:200])

        until(60, f"gateway.{app}.test through {address}", served)
        echo = json.loads(cluster.get_inside(url, f"gateway.{app}.test")[1])
        assert echo["service"] == "web" and echo["pod"].startswith("web-"), echo
        assert echo["family"] == f"ipv{ip.version}", (address, echo)
