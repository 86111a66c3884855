#!/usr/bin/env bash
# Builds the real control plane (etcd, kube-apiserver, kube-controller-manager) from the Go
# modules pinned in go.mod/go.sum into conformance/cluster/bin/ (ignored), and reuses that build
# while go.mod, go.sum, this script and the Go version are unchanged (a stamp holds their hash).
# Prints the bin directory on its last line. DUET_CLUSTER_BIN overrides the output directory.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
bin="${DUET_CLUSTER_BIN:-$here/bin}"
mkdir -p "$bin"

if ! command -v go >/dev/null 2>&1; then
  echo "build.sh: go not found on PATH (Go >= 1.26 builds the control plane)" >&2
  exit 1
fi

stamp_of_inputs() {
  { cat go.mod go.sum build.sh; go version; } | sha256sum | cut -d' ' -f1
}
want="$(stamp_of_inputs)"
if [[ -f "$bin/stamp" && "$(cat "$bin/stamp")" == "$want" ]] &&
  [[ -x "$bin/etcd" && -x "$bin/kube-apiserver" && -x "$bin/kube-controller-manager" ]]; then
  echo "control plane: reusing $bin (inputs unchanged)" >&2
  echo "$bin"
  exit 0
fi
rm -f "$bin/stamp"

# The version the binaries report (/version, --version) comes from linker flags, as in
# Kubernetes' own release builds; without them they call themselves v0.0.0-master.
kube_version="$(go list -m -f '{{.Version}}' k8s.io/kubernetes)"
etcd_version="$(go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)"
major="${kube_version#v}"
major="${major%%.*}"
minor="${kube_version#v*.}"
minor="${minor%%.*}"
kube_ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kube_ldflags+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
  kube_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

export CGO_ENABLED=0
# Two shared cores: one package compile at a time per core.
export GOFLAGS="${GOFLAGS:--p=2} -mod=readonly"
start=$(date +%s)
echo "control plane: building kube-apiserver, kube-controller-manager $kube_version, etcd $etcd_version into $bin" >&2
go build -trimpath -ldflags "-s -w$kube_ldflags" -o "$bin/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
go build -trimpath -ldflags "-s -w$kube_ldflags" -o "$bin/kube-controller-manager" \
  k8s.io/kubernetes/cmd/kube-controller-manager
go build -trimpath -ldflags "-s -w" -o "$bin/etcd" go.etcd.io/etcd/server/v3
echo "$want" >"$bin/stamp"
echo "control plane: built in $(($(date +%s) - start)) s" >&2
echo "$bin"
