#!/usr/bin/env bash
# Runs the upstream Gateway API conformance suite (sigs.k8s.io/gateway-api/conformance, the
# version go.mod pins), unmodified, against duet in the cluster KUBECONFIG names:
#
#   conformance/gateway/run.sh KUBECONFIG REPORT_DIR [NAME] [-- SUITE_FLAGS...]
#
# 0. builds the suite's test binary, the CRD installer and echo-basic into bin/ (build.sh: reused
#    while their inputs are unchanged; DUET_GATEWAY_BIN=DIR names a folder built before);
# 1. installs the CRDs of that version (bin/crds apply; DUET_GATEWAY_CHANNEL=experimental for the
#    experimental channel's, standard by default) and creates
#    the GatewayClass duet (controller duet.dev/gateway-controller) unless it exists;
# 2. runs TestConformance (conformance_test.go; bin/conformance.test -test.v) with duet's
#    defaults (options.go: GatewayClass duet, profiles GATEWAY-HTTP, GATEWAY-GRPC, GATEWAY-TLS, their
#    Core features, implementation duet-dev/duet at the workspace version) and writes the upstream ConformanceReport YAML to
#    REPORT_DIR/NAME.yaml (NAME defaults to gateway; use ipv4 / ipv6 for the two family runs).
#
# SUITE_FLAGS are upstream flags and win over duet's defaults, e.g. -run-test=HTTPRouteWeight,
# -supported-features=..., -cleanup-base-resources=false, -debug. DUET_ECHO_IMAGE=IMAGE renames
# the echo server image in the suite's manifests (for a cluster that runs its own echo build).
#
# The cluster must run duet as the controller of GatewayClass duet (duet.dev/gateway-controller),
# and this must run where the Gateways' addresses are reachable. `duet-conformance gateway`
# (README, "Gateway API conformance") does all that on the test cluster, per address family.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ $# -lt 2 ]]; then
  sed -n '2,22p' "${BASH_SOURCE[0]}" >&2
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

bin=${DUET_GATEWAY_BIN:-}
if [[ -z $bin ]]; then
  bin=$("$here/build.sh" | tail -n1)
fi
cd "$here"
"$bin/crds" apply -kubeconfig "$kubeconfig" -channel "${DUET_GATEWAY_CHANNEL:-standard}"
"$bin/crds" gatewayclass -kubeconfig "$kubeconfig"
echo "report: $report"
# exec: a parent-death signal given to this script (duet-conformance gateway gives one) holds
# for the suite too.
DUET_GATEWAY_CONFORMANCE=1 DUET_VERSION=${DUET_VERSION:-v$version} KUBECONFIG=$kubeconfig \
  exec "$bin/conformance.test" -test.v -test.count=1 -test.timeout 90m -test.run '^TestConformance$' \
  -kubeconfig="$kubeconfig" -report-output="$report" "$@"
