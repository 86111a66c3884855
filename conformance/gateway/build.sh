#!/usr/bin/env bash
# Builds what a Gateway API conformance run executes, into conformance/gateway/bin/ (ignored),
# and reuses each build while its inputs are unchanged (a stamp per binary holds their hash):
#
#   conformance.test  the upstream suite (TestConformance of this module, `go test -c`), from
#                     go.mod, go.sum and the module's .go files;
#   crds              the CRD and GatewayClass installer (./cmd/crds);
#   echo-basic        the suite's echo server, built from the source shipped in the pinned
#                     sigs.k8s.io/gateway-api/conformance module (echo-basic/, a nested module
#                     whose go.mod and go.sum are shipped as .go.mod and .go.sum), unmodified.
#
# Prints the bin directory on its last line. Needs Go >= 1.26 and the Go module proxy (or a
# module cache holding the modules) the first time.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
bin="$here/bin"
mkdir -p "$bin"

if ! command -v go >/dev/null 2>&1; then
  echo "build.sh: go not found on PATH (Go >= 1.26 builds the Gateway API suite)" >&2
  exit 1
fi
export CGO_ENABLED=0
# Two shared cores: one package compile at a time per core.
export GOFLAGS="${GOFLAGS:--p=2}"

# build NAME INPUT_FILES... -- COMMAND...: runs COMMAND unless bin/NAME is there and the hash of
# the inputs, this script and the Go version equals bin/NAME.stamp.
build() {
  local name=$1
  shift
  local inputs=()
  while [[ $1 != -- ]]; do
    inputs+=("$1")
    shift
  done
  shift
  local want
  want=$({ cat "${inputs[@]}" build.sh; go version; } | sha256sum | cut -d' ' -f1)
  if [[ -x $bin/$name && -f $bin/$name.stamp && $(cat "$bin/$name.stamp") == "$want" ]]; then
    echo "gateway suite: reusing $bin/$name (inputs unchanged)" >&2
    return
  fi
  rm -f "$bin/$name.stamp"
  local start
  start=$(date +%s)
  echo "gateway suite: building $name" >&2
  "$@"
  echo "$want" >"$bin/$name.stamp"
  echo "gateway suite: built $name in $(($(date +%s) - start)) s" >&2
}

mapfile -t suite_sources < <(find . -path ./bin -prune -o -name '*.go' -print | sort)
build conformance.test go.mod go.sum "${suite_sources[@]}" -- \
  go test -mod=readonly -c -trimpath -ldflags "-s -w" -o "$bin/conformance.test" .
build crds go.mod go.sum "${suite_sources[@]}" -- \
  go build -mod=readonly -trimpath -ldflags "-s -w" -o "$bin/crds" ./cmd/crds

# echo-basic: the module cache is read-only and the nested module's go.mod is shipped renamed,
# so the source is copied to a temporary folder with its go.mod and go.sum under their names.
suite_version=$(go list -mod=readonly -m -f '{{.Version}}' sigs.k8s.io/gateway-api/conformance)
suite_dir=$(go list -mod=readonly -m -f '{{.Dir}}' sigs.k8s.io/gateway-api/conformance)
if [[ -z $suite_dir || ! -d $suite_dir/echo-basic ]]; then
  go mod download sigs.k8s.io/gateway-api/conformance
  suite_dir=$(go list -mod=readonly -m -f '{{.Dir}}' sigs.k8s.io/gateway-api/conformance)
fi
build_echo_basic() {
  local tmp status=0
  tmp=$(mktemp -d)
  cp -r "$suite_dir/echo-basic/." "$tmp/"
  chmod -R u+w "$tmp"
  mv "$tmp/.go.mod" "$tmp/go.mod"
  mv "$tmp/.go.sum" "$tmp/go.sum"
  (cd "$tmp" && go build -mod=readonly -trimpath -ldflags "-s -w" -o "$bin/echo-basic" .) || status=$?
  rm -rf "$tmp"
  return "$status"
}
mapfile -t echo_sources < <(find "$suite_dir/echo-basic" -type f | sort)
echo "$suite_version" >"$bin/echo-basic.version"
build echo-basic "$bin/echo-basic.version" "${echo_sources[@]}" -- build_echo_basic
echo "$bin"
