"""deploy/duet.yaml is what deploy/generate.sh renders from the chart now (Helm's own CLI,
`helm template` with the default values, built by conformance/helm/build.sh): a change to the
chart without rerunning deploy/generate.sh fails here. And the file installs as documented: the
Namespace first, then every object of the chart's default install in that namespace.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "duet.yaml"
GENERATE = ROOT / "deploy" / "generate.sh"
NAMESPACE = "duet-system"


def test_deploy_manifests_are_what_the_chart_renders():
    result = subprocess.run([GENERATE, "--check"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]


def test_generate_check_fails_on_a_stale_file(tmp_path):
    # The check compares against deploy/duet.yaml: run it on a copy of the tree's deploy/ whose
    # file lacks one line, beside the real chart and Helm build.
    stale = tmp_path / "deploy"
    stale.mkdir()
    (tmp_path / "charts").symlink_to(ROOT / "charts")
    (tmp_path / "conformance").symlink_to(ROOT / "conformance")
    (stale / "generate.sh").symlink_to(GENERATE)
    lines = DEPLOY.read_text().splitlines(keepends=True)
    (stale / "duet.yaml").write_text("".join(line for line in lines if "maxUnavailable" not in line))
    script = stale / "generate.sh"
    result = subprocess.run([script, "--check"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 1, result.stderr[-4000:]
    assert "deploy/duet.yaml is stale: run deploy/generate.sh" in result.stderr
    assert "-  maxUnavailable" not in result.stderr and "+  maxUnavailable" in result.stderr


def test_deploy_manifests_install_the_default_release_in_its_namespace():
    docs = [d for d in yaml.safe_load_all(DEPLOY.read_text()) if d]
    assert docs[0] == {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "IngressClass"} <= kinds
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding", "IngressClass"}
    for d in docs:
        if d["kind"] not in cluster_scoped:
            assert d["metadata"]["namespace"] == NAMESPACE, d["metadata"]
    service = next(d for d in docs if d["kind"] == "Service" and d["spec"].get("type") == "LoadBalancer")
    assert service["spec"]["ipFamilyPolicy"] == "PreferDualStack"
