#!/usr/bin/env bash
# Creates (once) target/h3client-venv with aioquic, the independent HTTP/3 client the end-to-end
# tests drive through h3client.py, and prints its python. Idempotent: a venv that already has the
# pinned requirements is reused without touching the network.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="$root/target/h3client-venv"
req="$root/conformance/h3client/requirements.txt"
stamp="$venv/.requirements"
if [ ! -x "$venv/bin/python" ]; then
  if ! python3 -m venv "$venv" >/dev/null 2>&1; then
    # Debian's own python3 keeps venv (and ensurepip) in a separate package.
    rm -rf "$venv"
    apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
    python3 -m venv "$venv"
  fi
fi
if ! cmp -s "$req" "$stamp"; then
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$req" >&2
  cp "$req" "$stamp"
fi
echo "$venv/bin/python"
