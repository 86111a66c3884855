#!/usr/bin/env bash
# Copies the ConformanceReports of a `duet-conformance gateway` run into this folder under the
# names the upstream repository's conformance/reports/ folder asks for:
#
#   conformance/reports/update.sh REPORT_DIR
#
# REPORT_DIR is the run's --report-dir (ipv4.yaml, ipv6.yaml, ipv4-experimental.yaml,
# ipv6-experimental.yaml). Each report goes to
# GATEWAY_API_VERSION/duet/CHANNEL-VERSION-MODE-report.yaml, the three read from the report
# itself (gatewayAPIChannel, implementation.version, mode), so a name never disagrees with its
# content. conformance/tests/reports.rs checks what is committed.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ $# -ne 1 || ! -d $1 ]]; then
  sed -n '2,12p' "${BASH_SOURCE[0]}" >&2
  exit 64
fi
field() { sed -n "s/^$1: *\"\{0,1\}\([^\"]*\)\"\{0,1\}$/\1/p" "$2" | head -n1; }
copied=0
for name in ipv4 ipv6 ipv4-experimental ipv6-experimental; do
  report=$1/$name.yaml
  [[ -f $report ]] || continue
  api=$(field gatewayAPIVersion "$report")
  channel=$(field gatewayAPIChannel "$report")
  mode=$(field mode "$report")
  version=$(sed -n 's/^  version: *\(.*\)$/\1/p' "$report" | head -n1)
  if [[ -z $api || -z $channel || -z $mode || -z $version ]]; then
    echo "update.sh: $report lacks gatewayAPIVersion, gatewayAPIChannel, mode or implementation.version" >&2
    exit 1
  fi
  out=$here/$api/duet/$channel-$version-$mode-report.yaml
  mkdir -p "$(dirname "$out")"
  cp "$report" "$out"
  echo "$report -> ${out#"$here"/}"
  copied=$((copied + 1))
done
[[ $copied -gt 0 ]] || { echo "update.sh: no report in $1" >&2; exit 1; }
