#!/usr/bin/env python3
"""kube-load.py: creates a gen-scale.py folder's objects in a Kubernetes API server.

    benches/load/kube-load.py --kubeconfig KUBECONFIG DIR [--threads 8]
    benches/load/kube-load.py --kubeconfig KUBECONFIG --patch-slice NS/NAME --address OLD=NEW
    benches/load/kube-load.py --kubeconfig KUBECONFIG --patch-service NS/NAME

Each file's YAML documents are POSTed after their namespaces, as JSON when PyYAML is installed
(Debian `python3-yaml`: read here with libyaml, so the API server does not convert YAML), else as
they are (`Content-Type: application/yaml`); an object that already exists is left alone. Uses
the kubeconfig's first cluster and user (client certificate data, as the test clusters'
kubeconfigs hold them): no kubectl. The scale bench runs it inside the test cluster's network
namespace: the API server is on loopback there. Progress (objects and objects per second) goes
to stderr every 5,000 objects.

--patch-slice replaces one endpoint address of an EndpointSlice (a JSON patch of
`/endpoints/I/addresses/0`): OLD by NEW, or NEW by OLD when the slice holds NEW (a second run
on the same loaded cluster); prints the time the API server answered.

--patch-service sets `appProtocol: kubernetes.io/h2c` on a Service's first port, or removes it
when set (a JSON patch guarded by the resource version): a change of what the routes read of the
Service (the protocol spoken to its pods); prints the time the API server answered.
"""

import argparse
import base64
import concurrent.futures
import http.client
import json
import os
import re
import ssl
import sys
import tempfile
import threading
import time
import urllib.parse

try:
    import yaml
    YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
except ImportError:
    yaml = None

PATHS = {
    "Namespace": "/api/v1/namespaces",
    "Service": "/api/v1/namespaces/{ns}/services",
    "EndpointSlice": "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices",
    "Ingress": "/apis/networking.k8s.io/v1/namespaces/{ns}/ingresses",
    "IngressClass": "/apis/networking.k8s.io/v1/ingressclasses",
}


def kubeconfig_field(text: str, name: str) -> str:
    found = re.search(rf"^\s*{name}:\s*(\S+)\s*$", text, re.MULTILINE)
    if not found:
        sys.exit(f"the kubeconfig has no {name}")
    return found.group(1)


class Api:
    """One keep-alive HTTPS connection per thread to the kubeconfig's server."""

    def __init__(self, kubeconfig: str):
        text = open(kubeconfig, encoding="utf-8").read()
        url = urllib.parse.urlsplit(kubeconfig_field(text, "server"))
        self.host, self.port = url.hostname, url.port or 443
        self.tmp = tempfile.mkdtemp(prefix="kube-load.")
        files = {}
        for field in ("certificate-authority-data", "client-certificate-data", "client-key-data"):
            path = os.path.join(self.tmp, field)
            with open(path, "wb") as f:
                f.write(base64.b64decode(kubeconfig_field(text, field)))
            files[field] = path
        self.context = ssl.create_default_context(cafile=files["certificate-authority-data"])
        self.context.load_cert_chain(files["client-certificate-data"], files["client-key-data"])
        self.local = threading.local()

    def request(self, method: str, path: str, body: bytes, content_type: str):
        for attempt in range(5):
            conn = getattr(self.local, "conn", None)
            if conn is None:
                conn = http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=60)
                self.local.conn = conn
            try:
                conn.request(method, path, body, {"Content-Type": content_type})
                answer = conn.getresponse()
                return answer.status, answer.read()
            except (http.client.HTTPException, OSError):
                conn.close()
                self.local.conn = None
                if attempt == 4:
                    raise
                time.sleep(0.5)
        raise AssertionError("unreachable")

    def create(self, kind: str, ns: str, doc: str):
        if yaml is not None:
            body, content_type = json.dumps(yaml.load(doc, Loader=YAML_LOADER)).encode(), "application/json"
        else:
            body, content_type = doc.encode(), "application/yaml"
        status, body = self.request("POST", PATHS[kind].format(ns=ns), body, content_type)
        if status not in (200, 201, 409):
            sys.exit(f"creating a {kind} in {ns or 'the cluster'}: {status} {body[:300]!r}")


def documents(folder: str):
    """(kind, namespace, text) of every document in the folder's non-hidden YAML files."""
    for name in sorted(os.listdir(folder)):
        if name.startswith(".") or not name.endswith((".yaml", ".yml")):
            continue
        text = open(os.path.join(folder, name), encoding="utf-8").read()
        for doc in re.split(r"^---\s*$", text, flags=re.MULTILINE):
            kind = re.search(r"^kind:\s*(\w+)", doc, re.MULTILINE)
            if not kind:
                continue
            ns = re.search(r"namespace:\s*([a-z0-9-]+)", doc)
            yield kind.group(1), ns.group(1) if ns else "", doc


def load(api: Api, folder: str, threads: int) -> int:
    docs = list(documents(folder))
    unknown = {kind for kind, _, _ in docs if kind not in PATHS}
    if unknown:
        sys.exit(f"kinds this loader does not know: {sorted(unknown)}")
    for ns in sorted({ns for _, ns, _ in docs if ns}):
        api.create("Namespace", "", json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
    # Classes and Services before the objects that name them.
    order = {"IngressClass": 0, "Service": 1, "EndpointSlice": 2, "Ingress": 3}
    docs.sort(key=lambda d: order[d[0]])
    started = time.time()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for n, done in enumerate(pool.map(lambda d: api.create(*d), docs), 1):
            del done
            if n % 5000 == 0:
                elapsed = time.time() - started
                print(f"kube-load: {n} of {len(docs)} objects, {n / elapsed:.0f} a second", file=sys.stderr)
    return len(docs)


def patch_slice(api: Api, target: str, change: str):
    ns, name = target.split("/", 1)
    old, new = change.split("=", 1)
    path = PATHS["EndpointSlice"].format(ns=ns) + "/" + name
    status, body = api.request("GET", path, b"", "application/json")
    if status != 200:
        sys.exit(f"GET {path}: {status}")
    endpoints = json.loads(body)["endpoints"]
    index = next((i for i, e in enumerate(endpoints) if e["addresses"][0] == old), None)
    if index is None:
        # An earlier run on the same cluster put NEW there: swap back.
        old, new = new, old
        index = next((i for i, e in enumerate(endpoints) if e["addresses"][0] == old), None)
    if index is None:
        sys.exit(f"{target} has neither endpoint {old} nor {new}")
    patch = json.dumps([
        {"op": "test", "path": f"/endpoints/{index}/addresses/0", "value": old},
        {"op": "replace", "path": f"/endpoints/{index}/addresses/0", "value": new},
    ]).encode()
    status, body = api.request("PATCH", path, patch, "application/json-patch+json")
    answered = time.time()
    if status != 200:
        sys.exit(f"PATCH {path}: {status} {body[:300]!r}")
    print(f"{answered:.6f}")


def patch_service(api: Api, target: str):
    ns, name = target.split("/", 1)
    path = PATHS["Service"].format(ns=ns) + "/" + name
    status, body = api.request("GET", path, b"", "application/json")
    if status != 200:
        sys.exit(f"GET {path}: {status}")
    service = json.loads(body)
    ports = service.get("spec", {}).get("ports") or []
    if not ports:
        sys.exit(f"{target} has no port")
    guard = {"op": "test", "path": "/metadata/resourceVersion", "value": service["metadata"]["resourceVersion"]}
    if "appProtocol" in ports[0]:
        change = {"op": "remove", "path": "/spec/ports/0/appProtocol"}
    else:
        change = {"op": "add", "path": "/spec/ports/0/appProtocol", "value": "kubernetes.io/h2c"}
    status, body = api.request("PATCH", path, json.dumps([guard, change]).encode(), "application/json-patch+json")
    answered = time.time()
    if status != 200:
        sys.exit(f"PATCH {path}: {status} {body[:300]!r}")
    print(f"{answered:.6f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--patch-slice", metavar="NS/NAME")
    parser.add_argument("--address", metavar="OLD=NEW")
    parser.add_argument("--patch-service", metavar="NS/NAME")
    parser.add_argument("dir", nargs="?")
    args = parser.parse_args()
    api = Api(args.kubeconfig)
    if args.patch_service:
        patch_service(api, args.patch_service)
        return
    if args.patch_slice:
        if not args.address:
            parser.error("--patch-slice needs --address OLD=NEW")
        patch_slice(api, args.patch_slice, args.address)
        return
    if not args.dir:
        parser.error("the folder to load is missing")
    started = time.time()
    count = load(api, args.dir, args.threads)
    print(f"loaded {count} objects in {time.time() - started:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
