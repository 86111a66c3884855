#!/usr/bin/env python3
"""user-folder.py: a `duet serve --manifests` folder at scale, written the way a new user's is.

    benches/load/user-folder.py --out /tmp/uf --layout object      # one file per object
    benches/load/user-folder.py --out /tmp/uf --layout namespace   # one multi-document file per namespace
    benches/load/user-folder.py --out /tmp/uf --layout huge        # one `kind: List` file per kind

Unlike gen-scale.py (compact flow-style YAML, every Service alike), the objects here look like
`kubectl get -o yaml` output exported from a cluster: block style, uid/resourceVersion/
creationTimestamp, labels and annotations (including kubectl's last-applied-configuration, a JSON
copy of the object), Services with selectors and cluster IPs, EndpointSlices with the fields the
EndpointSlice controller writes (conditions ready/serving/terminating, nodeName, zone, a targetRef
with the pod's generated name and uid, ownerReferences), Ingresses with annotations and a varying
number of paths. Sizes vary per Service (1 to 19 pods, 10 on average).

Default size: 10,000 Ingresses, 10,000 dual-stack Services, 100,000 pods (an IPv4 and an IPv6
EndpointSlice per Service: 20,000 slices) over 50 namespaces, plus the IngressClass `duet`.
Pod addresses (10.64.0.0/10, fd00:10:64::/64) are data only and never contacted, except the
probe's: the first Service (`probe` in `team-00`, host `probe.user.example`) has one pod at
127.0.0.1:PROBE_PORT and [::1]:PROBE_PORT, so a bench can run a real upstream there, change the
IPv4 slice's address to 127.0.0.2 and see the new endpoint answer. A hidden `.folder.json` (duet
ignores hidden files) names the probe, the file holding its IPv4 slice and the text to change.
The output is the same for the same flags.
"""

import argparse
import hashlib
import json
import os
import sys

ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # what the ReplicaSet controller's names use


def digest(*parts) -> bytes:
    return hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=16).digest()


def uid(*parts) -> str:
    h = digest(*parts).hex()
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-a{h[17:20]}-{h[20:32]}"


def suffix(n: int, *parts) -> str:
    return "".join(ALPHABET[b % len(ALPHABET)] for b in digest(*parts)[:n])


def pod_ipv4(n: int) -> str:
    return f"10.{64 + n // 65536}.{(n // 256) % 256}.{n % 256}"


def pod_ipv6(n: int) -> str:
    return f"fd00:10:64::{n // 65536:x}:{n % 65536:x}"


def stamp(i: int) -> str:
    return f"2026-{1 + i % 12:02d}-{1 + i % 28:02d}T{i % 24:02d}:{i % 60:02d}:{(i * 7) % 60:02d}Z"


def indent(text: str, prefix: str) -> str:
    return "".join(prefix + line if line else line for line in text.splitlines(True))


def applied(obj: dict) -> str:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True)


def service(ns: str, name: str, i: int, target_port) -> str:
    last = {"apiVersion": "v1", "kind": "Service",
            "metadata": {"annotations": {}, "labels": {"app": name}, "name": name, "namespace": ns},
            "spec": {"ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "RequireDualStack",
                     "ports": [{"name": "http", "port": 80, "targetPort": target_port}],
                     "selector": {"app": name}}}
    return f"""apiVersion: v1
kind: Service
metadata:
  annotations:
    kubectl.kubernetes.io/last-applied-configuration: |
      {applied(last)}
  creationTimestamp: "{stamp(i)}"
  labels:
    app: {name}
    app.kubernetes.io/part-of: {ns}
  name: {name}
  namespace: {ns}
  resourceVersion: "{1000 + 4 * i}"
  uid: {uid("svc", ns, name)}
spec:
  clusterIP: 10.96.{i // 256 % 256}.{i % 256}
  clusterIPs:
  - 10.96.{i // 256 % 256}.{i % 256}
  - fd00:10:96::{i:x}
  internalTrafficPolicy: Cluster
  ipFamilies:
  - IPv4
  - IPv6
  ipFamilyPolicy: RequireDualStack
  ports:
  - name: http
    port: 80
    protocol: TCP
    targetPort: {target_port}
  selector:
    app: {name}
  sessionAffinity: None
  type: ClusterIP
status:
  loadBalancer: {{}}
"""


def endpoint(ns: str, name: str, pod: str, address: str, node: int) -> str:
    return f"""- addresses:
  - {address}
  conditions:
    ready: true
    serving: true
    terminating: false
  nodeName: node-{node}
  targetRef:
    kind: Pod
    name: {pod}
    namespace: {ns}
    uid: {uid("pod", ns, pod)}
  zone: zone-{"abc"[node % 3]}
"""


def endpoint_slice(ns: str, name: str, i: int, family: str, pods: list, port: int) -> str:
    """pods: (pod name, IPv4, IPv6, node) per pod."""
    slice_name = f"{name}-{suffix(5, 'eps', ns, name, family)}"
    endpoints = "".join(
        endpoint(ns, name, pod, v4 if family == "IPv4" else v6, node) for pod, v4, v6, node in pods
    )
    return f"""addressType: {family}
apiVersion: discovery.k8s.io/v1
endpoints:
{endpoints}kind: EndpointSlice
metadata:
  annotations:
    endpoints.kubernetes.io/last-change-trigger-time: "{stamp(i + 1)}"
  creationTimestamp: "{stamp(i)}"
  generateName: {name}-
  generation: {1 + len(pods)}
  labels:
    endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io
    kubernetes.io/service-name: {name}
    app: {name}
  name: {slice_name}
  namespace: {ns}
  ownerReferences:
  - apiVersion: v1
    blockOwnerDeletion: true
    controller: true
    kind: Service
    name: {name}
    uid: {uid("svc", ns, name)}
  resourceVersion: "{1001 + 4 * i + (family == "IPv6")}"
  uid: {uid("eps", ns, slice_name)}
ports:
- name: http
  port: {port}
  protocol: TCP
"""


PATHS = [("/", "Prefix"), ("/api", "Prefix"), ("/static/app.js", "Exact"), ("/v2", "ImplementationSpecific")]


def ingress(ns: str, name: str, host: str, i: int, paths: int) -> str:
    chosen = PATHS[:paths]
    rules = [{"host": host, "http": {"paths": [
        {"backend": {"service": {"name": name, "port": {"number": 80}}}, "path": p, "pathType": t}
        for p, t in chosen]}}]
    last = {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"annotations": {"team": ns}, "name": name, "namespace": ns},
            "spec": {"ingressClassName": "duet", "rules": rules}}
    text = "".join(f"""      - backend:
          service:
            name: {name}
            port:
              number: 80
        path: {p}
        pathType: {t}
""" for p, t in chosen)
    return f"""apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  annotations:
    kubectl.kubernetes.io/last-applied-configuration: |
      {applied(last)}
    team: {ns}
  creationTimestamp: "{stamp(i)}"
  generation: 1
  labels:
    app: {name}
  name: {name}
  namespace: {ns}
  resourceVersion: "{1003 + 4 * i}"
  uid: {uid("ing", ns, name)}
spec:
  ingressClassName: duet
  rules:
  - host: {host}
    http:
      paths:
{text}status:
  loadBalancer: {{}}
"""


CLASS = """apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata:
  name: duet
spec:
  controller: duet.dev/ingress-controller
"""


def objects(args: argparse.Namespace):
    """Yields (namespace, kind, name, yaml text) for every object but the IngressClass."""
    pod = 0
    for i in range(args.ingresses):
        ns = f"team-{i % args.namespaces:02d}"
        if i == 0:
            name, host, count, port = "probe", "probe.user.example", 1, args.probe_port
        else:
            name = f"{['web', 'api', 'shop', 'auth', 'search', 'media'][i % 6]}-{i}"
            host, count, port = f"{name}.{ns}.user.example", 1 + (i * 7919) % 19, 8080
        pods = []
        for _ in range(count):
            pod_name = f"{name}-{suffix(10, 'rs', ns, name)[:10]}-{suffix(5, 'pod', pod)}"
            pods.append((pod_name, pod_ipv4(pod), pod_ipv6(pod), pod % 50))
            pod += 1
        if i == 0:
            pods = [(pods[0][0], "127.0.0.1", "::1", 0)]
        yield ns, "svc", name, service(ns, name, i, "http" if i else port)
        yield ns, "eps-ipv4", name, endpoint_slice(ns, name, i, "IPv4", pods, port)
        yield ns, "eps-ipv6", name, endpoint_slice(ns, name, i, "IPv6", pods, port)
        yield ns, "ing", name, ingress(ns, name, host, i, 1 + i % len(PATHS))
    args.pods_total = pod


def as_list(items: list) -> str:
    body = "".join(indent(text, "  ").replace("  ", "- ", 1) for text in items)
    return f"apiVersion: v1\nitems:\n{body}kind: List\nmetadata:\n  resourceVersion: \"\"\n"


def generate(args: argparse.Namespace) -> dict:
    os.makedirs(args.out, exist_ok=True)
    if os.listdir(args.out):
        sys.exit(f"user-folder.py: {args.out} is not empty; give a new folder")
    files: dict = {}  # file name -> texts
    probe_file = None
    for ns, kind, name, text in objects(args):
        if args.layout == "object":
            file = f"{ns}_{kind}_{name}.yaml"
        elif args.layout == "namespace":
            file = f"{ns}.yaml"
        else:
            file = {"svc": "services.yaml", "ing": "ingresses.yaml"}.get(kind, "endpointslices.yaml")
        files.setdefault(file, []).append(text)
        if name == "probe" and kind == "eps-ipv4":
            probe_file = file
    with open(os.path.join(args.out, "ingressclass.yaml"), "w", encoding="utf-8") as f:
        f.write(CLASS)
    for file, texts in files.items():
        with open(os.path.join(args.out, file), "w", encoding="utf-8") as f:
            f.write(as_list(texts) if args.layout == "huge" else "---\n".join(texts))
    info = {
        "layout": args.layout, "files": len(files) + 1, "ingresses": args.ingresses,
        "services": args.ingresses, "endpointslices": 2 * args.ingresses, "pods": args.pods_total,
        "probe_host": "probe.user.example", "probe_port": args.probe_port,
        "endpointslice_file": probe_file,
        "endpointslice_old": "addresses:\n  - 127.0.0.1\n" if args.layout != "huge"
        else "addresses:\n    - 127.0.0.1\n",
        "endpointslice_new_address": "127.0.0.2",
    }
    with open(os.path.join(args.out, ".folder.json"), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=1)
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="folder to create (must be new or empty)")
    parser.add_argument("--layout", choices=["object", "namespace", "huge"], default="object")
    parser.add_argument("--ingresses", type=int, default=10_000, help="Ingresses = Services")
    parser.add_argument("--namespaces", type=int, default=50)
    parser.add_argument("--probe-port", type=int, default=18181,
                        help="the port of the probe Service's one real pod")
    args = parser.parse_args()
    if not 1 <= args.ingresses <= 500_000 or not 1 <= args.namespaces <= 100:
        parser.error("--ingresses must be 1..500000 and --namespaces 1..100")
    info = generate(args)
    print(f"{args.out}: {info['ingresses']} Ingresses, {info['endpointslices']} EndpointSlices, "
          f"{info['pods']} pods in {info['files']} files ({args.layout} layout)")


if __name__ == "__main__":
    main()
