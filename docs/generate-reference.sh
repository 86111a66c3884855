#!/usr/bin/env bash
# Regenerates the reference pages rendered from the code: docs/src/reference/*.md and
# charts/duet/README.md. `cargo test -p controller --test reference` fails while they are stale.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
exec cargo run --quiet --locked -p controller --example gen-reference -- "$root"
