#!/usr/bin/env bash
# Runs the Helm chart tests (charts/tests) in a virtualenv under target/, installing the pinned
# requirements once. Called by .ci/run; runnable by hand from anywhere in the repository.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="$root/target/chart-venv"
if [ ! -x "$venv/bin/python" ]; then
  if ! python3 -m venv "$venv" >/dev/null 2>&1; then
    # Debian's own python3 keeps venv (and ensurepip) in a separate package.
    rm -rf "$venv"
    apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
    python3 -m venv "$venv"
  fi
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check -r "$root/charts/tests/requirements.txt"
cd "$root"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider charts/tests "$@"
