#!/usr/bin/env bash
# Builds a real Kubernetes node into conformance/node/bin/ (ignored) and reuses that build while
# its inputs are unchanged (a stamp holds their hash):
#   kubelet, kube-proxy, kube-scheduler  from k8s.io/kubernetes, pinned in ../cluster/go.mod (the
#                                        control plane's module, so every component is one release)
#   containerd, containerd-shim-runc-v2, ctr, runc, the CNI plugins (bridge, host-local, loopback,
#   portmap) and crictl                  from the modules pinned in go.mod/go.sum beside this script
#   pause                                the sandbox process, compiled with `gcc -static` from the
#                                        kubernetes module's build/pause/linux/pause.c
#   metallb-controller, metallb-speaker  MetalLB's controller and speaker from go.universe.tf/metallb,
#                                        pinned in metallb/go.mod (a module of its own: it needs
#                                        newer k8s.io, cel-go and zap than containerd and cri-tools
#                                        are built with here)
# runc needs cgo and libseccomp (Debian: libseccomp-dev, pkg-config; test.sh installs them).
# Prints the bin directory on its last line. DUET_NODE_BIN overrides the output directory.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cluster="$here/../cluster"
bin="${DUET_NODE_BIN:-$here/bin}"
mkdir -p "$bin"

if ! command -v go >/dev/null 2>&1; then
  echo "node build.sh: go not found on PATH (Go >= 1.26 builds the node)" >&2
  exit 1
fi

node_tools=(kubelet kube-proxy kube-scheduler containerd containerd-shim-runc-v2 ctr runc
  bridge host-local loopback portmap crictl pause metallb-controller metallb-speaker)

stamp_of_inputs() {
  { cat "$here/go.mod" "$here/go.sum" "$here/build.sh" "$cluster/go.mod" "$cluster/go.sum" \
    "$here/metallb/go.mod" "$here/metallb/go.sum"
    go version
    gcc --version | head -1
  } |
    sha256sum | cut -d' ' -f1
}
all_built() {
  local tool
  for tool in "${node_tools[@]}"; do
    [[ -x "$bin/$tool" ]] || return 1
  done
}
want="$(stamp_of_inputs)"
if [[ -f "$bin/stamp" && "$(cat "$bin/stamp")" == "$want" ]] && all_built; then
  echo "node: reusing $bin (inputs unchanged)" >&2
  echo "$bin"
  exit 0
fi
rm -f "$bin/stamp"

# Version stamps as the upstream release builds set them (else they report v0.0.0 or "dev").
version_of() { (cd "$1" && go list -m -f '{{.Version}}' "$2"); }
kube_version="$(version_of "$cluster" k8s.io/kubernetes)"
containerd_version="$(version_of "$here" github.com/containerd/containerd/v2)"
runc_version="$(version_of "$here" github.com/opencontainers/runc)"
cni_version="$(version_of "$here" github.com/containernetworking/plugins)"
crictl_version="$(version_of "$here" sigs.k8s.io/cri-tools)"
metallb_version="$(version_of "$here/metallb" go.universe.tf/metallb)"
major="${kube_version#v}"
major="${major%%.*}"
minor="${kube_version#v*.}"
minor="${minor%%.*}"
kube_ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kube_ldflags+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
  kube_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
containerd_ldflags="-X github.com/containerd/containerd/v2/version.Version=$containerd_version"
containerd_ldflags+=" -X github.com/containerd/containerd/v2/version.Revision=module"

# Two shared cores: one package compile at a time per core.
export GOFLAGS="${GOFLAGS:--p=2} -mod=readonly"
start=$(date +%s)
echo "node: building kubelet, kube-proxy, kube-scheduler $kube_version, containerd $containerd_version," \
  "runc $runc_version, CNI plugins $cni_version, crictl $crictl_version, MetalLB $metallb_version into $bin" >&2

build() { # build DIR LDFLAGS OUT PACKAGE [TAGS]
  (cd "$1" && go build -trimpath -tags "${5:-}" -ldflags "-s -w $2" -o "$bin/$3" "$4")
}
export CGO_ENABLED=0
for cmd in kubelet kube-proxy kube-scheduler; do
  build "$cluster" "$kube_ldflags" "$cmd" "k8s.io/kubernetes/cmd/$cmd"
done
for cmd in containerd containerd-shim-runc-v2 ctr; do
  build "$here" "$containerd_ldflags" "$cmd" "github.com/containerd/containerd/v2/cmd/$cmd" \
    "no_devmapper no_zfs no_btrfs"
done
for plugin in main/bridge ipam/host-local main/loopback meta/portmap; do
  build "$here" "-X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$cni_version" \
    "${plugin#*/}" "github.com/containernetworking/plugins/plugins/$plugin"
done
build "$here" "-X sigs.k8s.io/cri-tools/pkg/version.Version=$crictl_version" crictl \
  sigs.k8s.io/cri-tools/cmd/crictl
# MetalLB's version is in its source (internal/version); its release sets only commit and branch.
for cmd in controller speaker; do
  build "$here/metallb" "" "metallb-$cmd" "go.universe.tf/metallb/$cmd"
done
CGO_ENABLED=1 build "$here" "-X main.version=${runc_version#v}" runc github.com/opencontainers/runc \
  "seccomp urfave_cli_no_docs"

kube_dir="$(cd "$cluster" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)"
gcc -Os -static -DVERSION="$kube_version" -o "$bin/pause" "$kube_dir/build/pause/linux/pause.c"
strip "$bin/pause"

echo "$want" >"$bin/stamp"
echo "node: built in $(($(date +%s) - start)) s" >&2
echo "$bin"
