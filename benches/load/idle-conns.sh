#!/usr/bin/env bash
# idle-conns.sh — resident memory an idle client connection costs duet (and nginx, when
# installed), measured as a user would: RSS from /proc before and after opening CONNS client
# connections, half to 127.0.0.1 and half to [::1], one request each, then idle. Loopback only.
#
#   cargo build --profile dist -p controller --bin duet && cargo build -p conformance --bin duet-echo
#   benches/load/idle-conns.sh                             # 5000 connections, every kind, both servers
#   CONNS=1000 KINDS="h1" SERVERS=duet benches/load/idle-conns.sh
#
# Kinds: h1 (HTTP/1.1 keep-alive, plain), h1-tls (HTTP/1.1 over TLS, ALPN http/1.1), h2-tls
# (HTTP/2 over TLS, ALPN h2; one stream, then idle), and, when named, h2-tls-busy: HTTP/2 over
# TLS connections that stay in use, one request per second each for BUSY seconds (default 60;
# h2load, CONNS/2 connections per family), RSS taken 2 s before the end (what long-lived
# connections, such as browsers', hold beyond an idle one). Both servers terminate TLS with the same
# ECDSA P-256 certificate and proxy Host `bench.example` over HTTP/1.1 keep-alive to one
# duet-echo pod of the client's family (nginx: `keepalive 64`, lib.sh's `write_nginx_conf`).
# Each kind gets a fresh server: 20 warm-up requests per family, RSS, CONNS connections (opened 100 at a time, requests one at a time so the upstream pool stays at one connection per
# family), 2 s to settle, RSS again. Printed per server and kind:
#   duet h1: 5000 idle connections, RSS 12.3 -> 170.1 MiB, 31.6 KiB per connection
# duet: release build, default worker threads, --max-connections 100000, --keepalive-timeout 10m.
# nginx: 1 worker, access_log off, keepalive_timeout and http2_idle_timeout 10m; the worker's RSS
# (the master's does not change). SERVERS defaults to "duet nginx" when nginx is installed.
# Fails (exit 1) when a server does not start, a request is not answered 200, or the server does
# not hold all CONNS connections.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CONNS=${CONNS:-5000}
KINDS=${KINDS:-"h1 h1-tls h2-tls"}
if [[ -z ${SERVERS:-} ]]; then
  SERVERS=duet
  if command -v nginx >/dev/null; then SERVERS="duet nginx"; else note "nginx not installed: duet only"; fi
fi
SETTLE=${SETTLE:-2}
BUSY=${BUSY:-60}

need curl python3 openssl ss
[[ $KINDS == *busy* ]] && need h2load
[[ $SERVERS == *duet* ]] && DUET=$(duet_bin)
# Each process (client, server) holds CONNS sockets and a few more.
FDS=$(ulimit -Hn)
[[ $FDS == unlimited ]] && FDS=$((2 * CONNS + 1024))
((FDS >= CONNS + 1024)) || die "the hard fd limit ($FDS) is below CONNS + 1024"
ulimit -n "$FDS" || die "cannot raise the fd limit to $FDS"
make_work idle
make_cert "$WORK"
read -r ECHO_PORT HTTP_PORT HTTPS_PORT ADMIN_PORT DEBUG_PORT < <(free_ports 5)
start_echo "$ECHO_PORT"
mkdir -p "$WORK/manifests"
write_proxy_manifests "$WORK/manifests" "$ECHO_PORT" "$WORK"

# Starts duet; sets SERVER_PID (the process whose RSS counts) and SERVER_MAIN (the one to stop).
start_duet() {
  DUET_LOG=warn "$DUET" serve --manifests "$WORK/manifests" --access-log off \
    --http-listen "127.0.0.1:$HTTP_PORT" --http-listen "[::1]:$HTTP_PORT" \
    --https-listen "127.0.0.1:$HTTPS_PORT" --https-listen "[::1]:$HTTPS_PORT" \
    --admin-listen "127.0.0.1:$ADMIN_PORT" --debug-listen "127.0.0.1:$DEBUG_PORT" \
    --default-tls-secret bench/bench-tls \
    --max-connections 100000 --keepalive-timeout 10m --shutdown-delay 0 --drain-timeout 1s \
    >"$WORK/duet.out" 2>"$WORK/duet.err" &
  SERVER_PID=$!
  SERVER_MAIN=$SERVER_PID
  STARTED_PIDS+=("$SERVER_PID")
  wait_200 "http://127.0.0.1:$ADMIN_PORT/readyz" 30 "$SERVER_PID"
}

# Starts nginx (master in the foreground, one worker); sets SERVER_PID to the worker and
# SERVER_MAIN to the master.
start_nginx() {
  write_nginx_conf "$WORK/nginx" "$ECHO_PORT" "$HTTPS_PORT" "$HTTP_PORT" "$WORK" \
    "worker_rlimit_nofile $FDS;
error_log $WORK/nginx/error.log warn;
events { worker_connections $((FDS - 64)); }" \
    "access_log off;
  keepalive_timeout 600s;
  keepalive_requests 100000;
  http2_idle_timeout 600s;"
  nginx -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" -g 'daemon off;' 2>"$WORK/nginx/stderr" &
  local master=$! tries=0
  SERVER_MAIN=$master
  STARTED_PIDS+=("$master")
  wait_200 "http://127.0.0.1:$HTTP_PORT/" 30 "$master" 2>/dev/null ||
    die "nginx did not start: $(cat "$WORK/nginx/stderr" "$WORK/nginx/error.log" 2>/dev/null)"
  until SERVER_PID=$(pgrep -P "$master" | head -1) && [[ -n $SERVER_PID ]]; do
    ((tries++ < 100)) || die "no nginx worker"
    sleep 0.05
  done
}

# 20 requests of KIND per family, so pools, TLS state and allocator arenas exist before the
# first RSS reading.
warm_up() {
  local kind=$1 scheme=https port=$HTTPS_PORT
  local -a opts=(-sk --resolve "bench.example:$HTTPS_PORT:127.0.0.1")
  case $kind in
    h1) scheme=http port=$HTTP_PORT ;;
    h1-tls) opts+=(--http1.1) ;;
    h2-tls) opts+=(--http2) ;;
  esac
  for host in 127.0.0.1 '[::1]'; do
    for _ in $(seq 20); do
      [[ $(curl "${opts[@]}" -o /dev/null -w '%{http_code}' -H 'Host: bench.example' \
        "$scheme://$host:$port/") == 200 ]] || die "$kind warm-up request to $host not answered 200"
    done
  done
}

# Connections the server holds on PORT (established, either family).
held() {
  ss -Htn state established "( sport = :$1 )" | wc -l
}

# h2-tls-busy: CONNS/2 HTTP/2 connections per family, each sending a request per second for BUSY
# seconds; prints the RSS 2 s before they end, then checks every request got a 2xx.
measure_busy() {
  local server=$1 before=$2 half=$((CONNS / 2)) after outs=() pids=() host out pid
  for host in 127.0.0.1 '[::1]'; do
    out="$WORK/h2load.$server.${#outs[@]}"
    outs+=("$out")
    h2load -c "$half" -m 1 --rps 1 -D "$BUSY" -H ':authority: bench.example' \
      "https://$host:$HTTPS_PORT/" >"$out" 2>&1 &
    pids+=($!)
    STARTED_PIDS+=($!)
  done
  sleep $((BUSY - 2))
  after=$(rss_kib "$SERVER_PID")
  for pid in "${pids[@]}"; do
    wait "$pid" || die "$server h2-tls-busy: h2load failed: $(tail -3 "${outs[@]}")"
  done
  for out in "${outs[@]}"; do
    grep -q ' 0 failed, 0 errored, 0 timeout' "$out" && grep -q ' 0 3xx, 0 4xx, 0 5xx' "$out" ||
      die "$server h2-tls-busy: not every request got a 2xx: $(grep -E 'requests:|status codes:' "$out")"
  done
  python3 -c "import sys; b, a, n, s = map(int, sys.argv[1:]); print(f'$server h2-tls-busy: {n} connections busy for {s} s, RSS {b / 1024:.1f} -> {a / 1024:.1f} MiB, {(a - b) / n:.1f} KiB per connection')" \
    "$before" "$after" "$((2 * half))" "$BUSY"
  stop "$SERVER_MAIN"
}

measure() {
  local server=$1 kind=$2 port=$HTTPS_PORT before after client_out
  [[ $kind == h1 ]] && port=$HTTP_PORT
  "start_$server"
  warm_up "${kind%-busy}"
  sleep 1
  before=$(rss_kib "$SERVER_PID")
  [[ $kind == h2-tls-busy ]] && {
    measure_busy "$server" "$before"
    return
  }
  client_out="$WORK/client.$server.$kind"
  python3 "$LOAD_DIR/idle_client.py" --kind "$kind" --port "$port" --conns "$CONNS" >"$client_out" 2>&1 &
  local client=$!
  STARTED_PIDS+=("$client")
  until grep -qs "^open" "$client_out"; do
    kill -0 "$client" 2>/dev/null || die "$server $kind: the client failed: $(cat "$client_out")"
    sleep 0.2
  done
  sleep "$SETTLE"
  after=$(rss_kib "$SERVER_PID")
  local holding
  holding=$(held "$port")
  ((holding >= CONNS)) || die "$server $kind: $CONNS connections opened, the server holds $holding"
  kill -0 "$client" || die "$server $kind: the client died"
  python3 -c "import sys; b, a, n = map(int, sys.argv[1:]); print(f'$server $kind: {n} idle connections, RSS {b / 1024:.1f} -> {a / 1024:.1f} MiB, {(a - b) / n:.1f} KiB per connection')" \
    "$before" "$after" "$CONNS"
  stop "$client"
  stop "$SERVER_MAIN"
}

# Stops PID (SIGTERM), waits for it and forgets it.
stop() {
  local pid=$1 keep=() p
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  for p in "${STARTED_PIDS[@]}"; do
    [[ $p == "$pid" ]] || keep+=("$p")
  done
  STARTED_PIDS=("${keep[@]}")
}

note "$CONNS connections per kind; duet $(duet_bin); $(nginx -v 2>&1 || true); $(nproc) cores, $(date -u +%FT%TZ)"
for server in $SERVERS; do
  for kind in $KINDS; do
    measure "$server" "$kind"
  done
done
