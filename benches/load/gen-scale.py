#!/usr/bin/env python3
"""gen-scale.py: writes a `duet serve --manifests` folder at scale.

    benches/load/gen-scale.py --out /tmp/scale                  # the default: the 10k-Ingress scale folder
    benches/load/gen-scale.py --out /tmp/s --ingresses 1000 --pods 4 --paths 3 --layout service

Default size: 10,000 Ingresses (host `app-N.scale.example`, two paths each: `/api` Prefix and
`/static/index.html` Exact), 10,000 dual-stack Services (one per Ingress), 10 pods per Service
with one IPv4 and one IPv6 address each, in one IPv4 and one IPv6 EndpointSlice per Service
(20,000 slices, 100,000 pods), spread over 20 namespaces, plus the IngressClass `duet`.

Addresses are data only: duet never connects to them unless a request is routed there, and the
scale bench sends none. Even so they are loopback (IPv4 pod n is 127.(1 + n / 65536).x.y, so
100,000 pods fit below 127.3.0.0) and ULA (IPv6 pod n is fd00:5ca1:e::<n>), never routable;
`--addresses benchmark` (for an API server, which refuses loopback endpoints: scale-kube.sh)
uses 198.18.0.0/15 and 2001:db8:5ca1:e::/64 instead.

Layouts: `object` (default) writes one file per object (`eps-<ns>-<svc>-ipv4.yaml`, ...), so a
bench can change one EndpointSlice file; `service` writes one file per Service holding the
Service, its two slices and its Ingress. A hidden `.scale.json` (duet ignores hidden files) tells
scale.sh which file holds the first Service's IPv4 slice, which holds its Ingress, and what to
change. The output is the same for the same flags.

Creation times: none by default (every Ingress is equally old, so duet takes them in namespace/
name order). `--created shuffled` gives each Ingress a `creationTimestamp`, one second apart in an
order unrelated to the names (seeded: the same every time), as in a cluster where Ingresses were
created over time; duet resolves conflicts oldest first, so that is the order it reads them in.
"""

import argparse
import ipaddress
import datetime
import json
import os
import random
import sys


# `--addresses`: loopback/ULA for --manifests folders; the benchmarking range (RFC 2544,
# 198.18.0.0/15) and the documentation prefix (2001:db8::/32) for an API server, which refuses
# loopback addresses in EndpointSlices and IPv6 ones not in canonical form. None is ever routed to.
ADDRESSES = {
    "loopback": (lambda n: f"127.{1 + n // 65536}.{(n // 256) % 256}.{n % 256}",
                 lambda n: f"fd00:5ca1:e::{n // 65536:x}:{n % 65536:x}",
                 "127.254.254.254", 253 * 65536),
    "benchmark": (lambda n: f"198.{18 + n // 65536}.{(n // 256) % 256}.{n % 256}",
                  lambda n: str(ipaddress.IPv6Address(f"2001:db8:5ca1:e::{n // 65536:x}:{n % 65536:x}")),
                  "198.19.255.254", 2 * 65536 - 2),
}
ADDRESS_PLAN = "loopback"


def pod_ipv4(n: int) -> str:
    return ADDRESSES[ADDRESS_PLAN][0](n)


def pod_ipv6(n: int) -> str:
    return ADDRESSES[ADDRESS_PLAN][1](n)


def pod_uid(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012x}"


def service_yaml(ns: str, name: str) -> str:
    return f"""apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: {ns}}}
spec:
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  ports: [{{name: http, port: 80, targetPort: http}}]
"""


def slice_yaml(ns: str, name: str, family: str, first_pod: int, pods: int, zones: int = 0) -> str:
    address = pod_ipv4 if family == "IPv4" else pod_ipv6
    lines = [
        "apiVersion: discovery.k8s.io/v1",
        "kind: EndpointSlice",
        "metadata:",
        f"  name: {name}-{family.lower()}",
        f"  namespace: {ns}",
        f"  labels: {{kubernetes.io/service-name: {name}}}",
        f"addressType: {family}",
        "ports: [{name: http, port: 8080, protocol: TCP}]",
        "endpoints:",
    ]
    for n in range(first_pod, first_pod + pods):
        # A pod's zone, as the endpointslice controller writes it from its node's label.
        zone = f"    zone: zone-{n % zones}\n" if zones else ""
        lines.append(
            f'  - addresses: ["{address(n)}"]\n'
            f"    conditions: {{ready: true}}\n"
            f"{zone}"
            f"    targetRef: {{kind: Pod, namespace: {ns}, name: {name}-{n - first_pod}, uid: {pod_uid(n)}}}"
        )
    return "\n".join(lines) + "\n"


PATHS = [("/api", "Prefix"), ("/static/index.html", "Exact")]


def path_for(p: int) -> tuple:
    if p < len(PATHS):
        return PATHS[p]
    return (f"/extra/{p}", "Prefix")


def ingress_yaml(ns: str, name: str, index: int, paths: int, created: str = "") -> str:
    stamp = f"creationTimestamp: '{created}', " if created else ""
    lines = [
        "apiVersion: networking.k8s.io/v1",
        "kind: Ingress",
        f"metadata: {{{stamp}name: {name}, namespace: {ns}}}",
        "spec:",
        "  ingressClassName: duet",
        "  rules:",
        f"    - host: app-{index}.scale.example",
        "      http:",
        "        paths:",
    ]
    for p in range(paths):
        path, kind = path_for(p)
        lines.append(
            f"          - {{path: {path}, pathType: {kind}, "
            f"backend: {{service: {{name: {name}, port: {{name: http}}}}}}}}"
        )
    return "\n".join(lines) + "\n"


CLASS = """apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: duet}
spec: {controller: duet.dev/ingress-controller}
"""


def write(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def created(args: argparse.Namespace, epoch: datetime.datetime, rank: int) -> str:
    if args.created == "none":
        return ""
    return (epoch + datetime.timedelta(seconds=rank)).strftime("%Y-%m-%dT%H:%M:%SZ")


def generate(args: argparse.Namespace) -> dict:
    os.makedirs(args.out, exist_ok=True)
    if os.listdir(args.out):
        sys.exit(f"gen-scale.py: {args.out} is not empty; give a new folder")
    write(os.path.join(args.out, "class.yaml"), CLASS)
    info = {}
    # `--created shuffled`: Ingress i was created rank[i] seconds after the epoch below.
    rank = list(range(args.ingresses))
    random.Random(13).shuffle(rank)
    epoch = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    for i in range(args.ingresses):
        ns, name = f"ns-{i % args.namespaces}", f"app-{i}"
        first_pod = i * args.pods
        objects = {
            "svc": service_yaml(ns, name),
            "eps-ipv4": slice_yaml(ns, name, "IPv4", first_pod, args.pods, args.zones),
            "eps-ipv6": slice_yaml(ns, name, "IPv6", first_pod, args.pods, args.zones),
            "ing": ingress_yaml(ns, name, i, args.paths, created(args, epoch, rank[i])),
        }
        if args.layout == "object":
            files = {k: f"{k}-{ns}-{name}.yaml" for k in objects}
            for kind, text in objects.items():
                write(os.path.join(args.out, files[kind]), text)
        else:
            files = {k: f"{ns}-{name}.yaml" for k in objects}
            write(os.path.join(args.out, files["svc"]), "---\n".join(objects.values()))
        if i == 0:
            info = {
                "endpointslice_file": files["eps-ipv4"],
                "endpointslice_address": pod_ipv4(first_pod),
                "endpointslice_new_address": ADDRESSES[ADDRESS_PLAN][2],
                "ingress_file": files["ing"],
                "ingress_host": f"app-{i}.scale.example",
                "ingress_service": name,
                "ingress_new_path": "/scale-bench-added",
            }
    info.update(
        ingresses=args.ingresses,
        services=args.ingresses,
        endpointslices=2 * args.ingresses,
        pods=args.ingresses * args.pods,
        paths_per_ingress=args.paths,
        layout=args.layout,
        zones=args.zones,
        created=args.created,
    )
    write(os.path.join(args.out, ".scale.json"), json.dumps(info, indent=1) + "\n")
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="folder to create (must be new or empty)")
    parser.add_argument("--ingresses", type=int, default=10_000, help="Ingresses = Services")
    parser.add_argument("--pods", type=int, default=10, help="dual-stack pods per Service")
    parser.add_argument("--paths", type=int, default=2, help="paths per Ingress")
    parser.add_argument("--namespaces", type=int, default=20)
    parser.add_argument("--layout", choices=["object", "service"], default="object")
    parser.add_argument("--addresses", choices=sorted(ADDRESSES), default="loopback",
                        help="pod addresses: loopback/ULA, or 198.18.0.0/15 and 2001:db8:: for an API server")
    parser.add_argument("--created", choices=["none", "shuffled"], default="none",
                        help="Ingress creationTimestamps: none, or one second apart in an order "
                             "unrelated to the names")
    parser.add_argument("--zones", type=int, default=0,
                        help="topology zones the pods spread over (zone-0 ...); 0: endpoints name none")
    args = parser.parse_args()
    global ADDRESS_PLAN
    ADDRESS_PLAN = args.addresses
    if not 1 <= args.ingresses <= 1_000_000 or not 1 <= args.pods <= 1000:
        parser.error("--ingresses must be 1..1000000 and --pods 1..1000")
    if args.ingresses * args.pods >= ADDRESSES[ADDRESS_PLAN][3]:
        parser.error(f"too many pods for the {ADDRESS_PLAN} addresses")
    if args.paths < 1 or args.namespaces < 1:
        parser.error("--paths and --namespaces must be at least 1")
    if not 0 <= args.zones <= 1000:
        parser.error("--zones must be 0..1000")
    info = generate(args)
    print(
        f"{args.out}: {info['ingresses']} Ingresses, {info['services']} Services, "
        f"{info['endpointslices']} EndpointSlices, {info['pods']} pods ({args.layout} layout)"
    )


if __name__ == "__main__":
    main()
