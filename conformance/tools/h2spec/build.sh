#!/usr/bin/env bash
# Builds h2spec (github.com/summerwind/h2spec, pinned in go.mod/go.sum beside this script) into
# OUT (default: <repo>/target/tools/h2spec) unless it is already there and newer than go.sum,
# and prints its path. Needs Go 1.19 or later (Debian: golang-go).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=${1:-$here/../../../target/tools/h2spec}
if [[ -x $out && $out -nt $here/go.sum ]]; then
  echo "$out"
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  echo "build.sh: go is not installed (Debian: apt-get install golang-go)" >&2
  exit 127
fi
mkdir -p "$(dirname "$out")"
(cd "$here" && go build -mod=readonly -o "$out.tmp" github.com/summerwind/h2spec/cmd/h2spec)
mv "$out.tmp" "$out"
echo "$out"
