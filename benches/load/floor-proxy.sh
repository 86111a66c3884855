#!/usr/bin/env bash
# Runs floor-relay (benches/floor-relay: bytes relayed, nothing parsed, routed, added or counted)
# as an extra proxy of ../shared/bench/proxy-bench.sh, so that the shared bench itself shows the
# least CPU per request any proxy can spend on the machine it runs on, beside nginx and duet.
# proxy-bench.sh takes extra proxies from a file of "name port command" lines:
#
#   cargo build --release -p floor-relay
#   echo "floor 18095 $PWD/benches/load/floor-proxy.sh \$PORT \$UPSTREAM_PORT" > /tmp/floor.txt
#   cd ../shared/bench && PROXIES="direct-c0 nginx" EXTRA_PROXIES=/tmp/floor.txt \
#     PROXY_NAME=duet PROXY_PORT=18090 \
#     PROXY_CMD="$OLDPWD/benches/load/duet-proxy.sh \$PORT \$UPSTREAM_ADDR" ./proxy-bench.sh
#
# The relay needs an upstream of each listener's family: the bench's upstream nginx listens on
# 127.0.0.1 and [::1] at UPSTREAM_PORT, so IPv6 clients are relayed over IPv6 (nginx and duet
# forward both families to UPSTREAM_FAMILY's address). FLOOR_BIN overrides the binary (default:
# target/release/floor-relay of this checkout).
set -euo pipefail
[[ $# == 2 ]] || {
  echo "usage: floor-proxy.sh PORT UPSTREAM_PORT" >&2
  exit 64
}
port=$1
upstream_port=$2
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bin=$(floor_bin)
exec "$bin" --listen "127.0.0.1:$port" --listen "[::1]:$port" \
  --upstream "127.0.0.1:$upstream_port" --upstream "[::1]:$upstream_port"
