"""The Grafana dashboard shipped in the chart against what duet really exposes: runs the real
duet on a folder of manifests, sends traffic over IPv4 and IPv6 (with a pod whose IPv4 address
refuses connections, so fallbacks, connect failures and ejections happen), scrapes /metrics and
checks that every series and label the dashboard queries exists.
"""

from __future__ import annotations

import http.server
import json
import re
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

from test_chart import CHART, METRICS
from test_real_cluster import binary

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


def get(url: str, host: str) -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"Host": host})
    try:
        with urllib.request.urlopen(req, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError as error:
        return 0, str(error)


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


# Needs a TLS Secret to appear; only its name is checked (against METRICS).
NEEDS_TLS = {"duet_tls_certificate_expiry_timestamp_seconds"}
# Labels Prometheus adds at scrape time (the ServiceMonitor honours duet's own namespace/service).
SCRAPE_LABELS = {"job", "instance", "pod", "le"}

MANIFESTS = """\
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {{name: duet}}
spec: {{controller: duet.dev/ingress-controller}}
---
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: app}}
spec:
  ports: [{{name: http, port: 80, targetPort: {open}}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: web-v4, namespace: app, labels: {{kubernetes.io/service-name: web}}}}
addressType: IPv4
ports: [{{name: http, port: {closed}}}]
endpoints:
  - addresses: ["127.0.0.1"]
    targetRef: {{kind: Pod, namespace: app, name: web-0, uid: 00000000-0000-4000-8000-00000000000a}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: web-v6, namespace: app, labels: {{kubernetes.io/service-name: web}}}}
addressType: IPv6
ports: [{{name: http, port: {open}}}]
endpoints:
  - addresses: ["::1"]
    targetRef: {{kind: Pod, namespace: app, name: web-0, uid: 00000000-0000-4000-8000-00000000000a}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {{name: web, namespace: app}}
spec:
  ingressClassName: duet
  rules:
    - host: web.test
      http:
        paths:
          - {{path: /, pathType: Prefix, backend: {{service: {{name: web, port: {{number: 80}}}}}}}}
"""


def exposition(text: str) -> dict[str, set[str]]:
    """Series names (with _total/_bucket/_sum/_count as exposed) -> the label names they carry."""
    series: dict[str, set[str]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s", line)
        assert match, line
        labels = set(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', match.group(3) or ""))
        series.setdefault(match.group(1), set()).update(labels)
    return series


def dashboard_queries() -> list[str]:
    dashboard = json.loads((CHART / "dashboards" / "duet.json").read_text())
    return [t["expr"] for p in dashboard["panels"] if p["type"] != "row" for t in p["targets"]]


@pytest.fixture
def scraped(tmp_path):
    backend = Server6(("::1", 0), Backend)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    closed = free_port("127.0.0.1")  # nothing listens there: IPv4 connects are refused
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "app.yaml").write_text(MANIFESTS.format(open=backend.server_address[1], closed=closed))
    try:
        # Start again on fresh ports if another process took one before duet bound it.
        for attempt in range(5):
            http_port, admin_port = free_port_both(), free_port("127.0.0.1")
            duet = subprocess.Popen(
                [binary("duet", "controller"), "serve", "--manifests", tmp_path / "m",
                 f"--http-listen=127.0.0.1:{http_port}", f"--http-listen=[::1]:{http_port}",
                 f"--https-listen=127.0.0.1:{free_port('127.0.0.1')}", f"--admin-listen=127.0.0.1:{admin_port}"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            if wait_ready(admin_port, duet):
                break
        else:
            pytest.fail("duet did not start in 5 attempts")
        try:
            for base in (f"http://127.0.0.1:{http_port}", f"http://[::1]:{http_port}"):
                for _ in range(4):
                    assert get(base + "/", "web.test") == (200, "backend via ipv6\n")
                assert get(base + "/", "unknown.test")[0] == 404
            with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/metrics", timeout=5) as response:
                yield response.read().decode()
        finally:
            duet.terminate()
            duet.wait(timeout=40)
    finally:
        backend.shutdown()


def test_dashboard_queries_only_series_and_labels_duet_exposes(scraped):
    series = exposition(scraped)
    exprs = dashboard_queries()
    used = set()
    for expr in exprs:
        names = set(re.findall(r"\bduet_[a-z_]+", expr))
        used |= names
        grouped = {label for group in re.findall(r"by \(([^)]*)\)", expr) for label in re.split(r"\s*,\s*", group)}
        for name in names:
            if name in NEEDS_TLS:
                continue
            assert name in series, f"the dashboard queries {name}, duet exposes no such series: {expr}"
            matched = set(re.findall(rf"\b{name}\{{([^}}]*)\}}", expr))
            labels = {label for m in matched for label in re.findall(r"([a-z_]+)\s*=~?", m)}
            missing = (labels | grouped) - series[name] - SCRAPE_LABELS
            assert not missing, f"{name} has no label(s) {sorted(missing)} (has {sorted(series[name])}): {expr}"
    base = {re.sub(r"_(bucket|sum|count)$", "", name) for name in used}
    assert base <= METRICS
    assert NEEDS_TLS <= METRICS
