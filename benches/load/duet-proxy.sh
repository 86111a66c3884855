#!/usr/bin/env bash
# Runs duet as the proxy under test for ../shared/bench/proxy-bench.sh:
#   PROXY_NAME=duet PROXY_PORT=18090 \
#   PROXY_CMD='/path/to/duet/benches/load/duet-proxy.sh $PORT $UPSTREAM_ADDR' ./proxy-bench.sh
# Writes a manifest folder with one host-less Ingress whose Service has one pod at the bench's
# upstream address, then execs duet in the foreground with one Tokio worker (the harness pins it
# to one core) and the access log off. DUET_BIN overrides the binary (default: target/dist/duet
# of this checkout, `cargo build --profile dist -p controller --bin duet`).
# benches/load/floor-proxy.sh runs floor-relay beside it: the least CPU per request any proxy can
# spend, in the same run.
set -euo pipefail
port=$1
upstream=$2 # host:port, IPv6 bracketed
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bin=${DUET_BIN:-$root/target/dist/duet}
host=${upstream%:*}
uport=${upstream##*:}
host=${host#[}
host=${host%]}
if [[ $host == *:* ]]; then type=IPv6; else type=IPv4; fi
dir=$(mktemp -d /tmp/duet-bench.XXXXXX)
cat >"$dir/bench.yaml" <<YAML
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: duet}
spec: {controller: duet.dev/ingress-controller}
---
apiVersion: v1
kind: Service
metadata: {name: upstream, namespace: bench}
spec:
  ports: [{name: http, port: 80, targetPort: $uport}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: upstream-$type
  namespace: bench
  labels: {kubernetes.io/service-name: upstream}
addressType: $type
ports: [{name: http, port: $uport}]
endpoints:
  - addresses: ["$host"]
    targetRef: {kind: Pod, namespace: bench, name: upstream-0, uid: 00000000-0000-0000-0000-000000000001}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: bench, namespace: bench}
spec:
  ingressClassName: duet
  rules:
    - http:
        paths:
          - {path: /, pathType: Prefix, backend: {service: {name: upstream, port: {name: http}}}}
YAML
export TOKIO_WORKER_THREADS=${TOKIO_WORKER_THREADS:-1}
export DUET_LOG=${DUET_LOG:-warn}
# The access log is off like nginx's in the bench config; metrics are on (they cannot be turned off).
exec "$bin" serve --manifests "$dir" --access-log off \
  --http-listen "127.0.0.1:$port" --http-listen "[::1]:$port" \
  --admin-listen "127.0.0.1:$((port + 1))" --admin-listen "[::1]:$((port + 1))"
