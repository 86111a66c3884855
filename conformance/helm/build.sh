#!/usr/bin/env bash
# Builds Helm's own command-line tool (helm.sh/helm/v4/cmd/helm, pinned in go.mod/go.sum beside
# this script) into conformance/helm/bin/ (ignored), as the real-node scenarios install and
# upgrade the chart the way users do; reuses that build while its inputs are unchanged (a stamp).
# Prints the bin directory on its last line. DUET_HELM_BIN overrides the output directory.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
bin="${DUET_HELM_BIN:-$here/bin}"
mkdir -p "$bin"
if ! command -v go >/dev/null 2>&1; then
  echo "helm build.sh: go not found on PATH (Go >= 1.26 builds helm)" >&2
  exit 1
fi
want="$({ cat go.mod go.sum build.sh; go version; } | sha256sum | cut -d' ' -f1)"
if [[ -f "$bin/stamp" && "$(cat "$bin/stamp")" == "$want" && -x "$bin/helm" ]]; then
  echo "helm: reusing $bin (inputs unchanged)" >&2
  echo "$bin"
  exit 0
fi
rm -f "$bin/stamp"
version="$(go list -m -f '{{.Version}}' helm.sh/helm/v4)"
start=$(date +%s)
echo "helm: building helm $version into $bin" >&2
# The version `helm version` reports comes from linker flags, as in Helm's release builds.
CGO_ENABLED=0 GOFLAGS="${GOFLAGS:--p=2} -mod=readonly" go build -trimpath \
  -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$version" -o "$bin/helm" helm.sh/helm/v4/cmd/helm
echo "$want" >"$bin/stamp"
echo "helm: built in $(($(date +%s) - start)) s" >&2
echo "$bin"
