#!/usr/bin/env bash
# Runs the Helm chart tests (charts/tests) in a virtualenv under target/, installing the pinned
# requirements once. Called by .ci/run; runnable by hand from anywhere in the repository.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="$root/target/chart-venv"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check -r "$root/charts/tests/requirements.txt"
cd "$root"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider charts/tests "$@"
