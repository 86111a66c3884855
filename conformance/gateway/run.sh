#!/usr/bin/env bash
# Runs the upstream Gateway API conformance suite (sigs.k8s.io/gateway-api/conformance, the
# version go.mod pins), unmodified, against duet in the cluster KUBECONFIG names:
#
#   conformance/gateway/run.sh KUBECONFIG REPORT_DIR [NAME] [-- SUITE_FLAGS...]
#
# 1. installs the standard-channel CRDs of that version (go run ./cmd/crds apply) and creates
#    the GatewayClass duet (controller duet.dev/gateway-controller) unless it exists;
# 2. runs TestConformance (conformance_test.go) with duet's defaults (options.go: GatewayClass
#    duet, profiles GATEWAY-HTTP and GATEWAY-GRPC, their Core features, implementation
#    duet-dev/duet at the workspace version) and writes the upstream ConformanceReport YAML to
#    REPORT_DIR/NAME.yaml (NAME defaults to gateway; use ipv4 / ipv6 for the two family runs).
#
# SUITE_FLAGS are upstream flags and win over duet's defaults, e.g. -run-test=HTTPRouteWeight,
# -supported-features=..., -cleanup-base-resources=false, -debug. DUET_ECHO_IMAGE=IMAGE renames
# the echo server image in the suite's manifests (for a cluster that runs its own echo build).
#
# The cluster must run duet as the controller of GatewayClass duet (duet.dev/gateway-controller).
# Not run by .ci/run: duet does not implement Gateway API yet (README, "Gateway API (in progress)").
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ $# -lt 2 ]]; then
  sed -n '2,19p' "${BASH_SOURCE[0]}" >&2
  exit 64
fi
if [[ ! -f $1 ]]; then
  echo "run.sh: no kubeconfig at $1" >&2
  exit 64
fi
kubeconfig=$(realpath "$1")
report_dir=$2
name=gateway
shift 2
if [[ $# -gt 0 && $1 != -- ]]; then
  name=$1
  shift
fi
[[ ${1:-} == -- ]] && shift
mkdir -p "$report_dir"
report=$(realpath "$report_dir")/$name.yaml
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$here/../../Cargo.toml" | head -n1)

cd "$here"
go run -mod=readonly ./cmd/crds apply -kubeconfig "$kubeconfig"
go run -mod=readonly ./cmd/crds gatewayclass -kubeconfig "$kubeconfig"
DUET_GATEWAY_CONFORMANCE=1 DUET_VERSION=${DUET_VERSION:-v$version} KUBECONFIG=$kubeconfig \
  go test -mod=readonly -count=1 -timeout 90m -run '^TestConformance$' . -args \
  -kubeconfig="$kubeconfig" -report-output="$report" "$@"
echo "report: $report"
