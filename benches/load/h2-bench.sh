#!/usr/bin/env bash
# h2-bench.sh — CPU per request over HTTP/2 with TLS (the client path `../shared/bench`, wrk
# over HTTP/1.1, does not cover): duet against nginx's `http2` in the same run. Loopback only.
# KINDS=h1 measures plain HTTP/1.1 keep-alive the same way (50 connections, one request at a
# time each, as the shared bench's wrk), against nginx with the same forwarding headers.
# KINDS=h3 measures HTTP/3 (QUIC on the HTTPS port's UDP twin, duet started with --http3; 20
# connections x 10 streams from h3load, benches/h3load: `cargo build --release -p h3load`),
# duet only: Debian's nginx 1.22.1 is built without QUIC.
#
#   cargo build --profile dist -p controller --bin duet && cargo build -p conformance --bin duet-echo
#   benches/load/h2-bench.sh                       # 3 rounds, 10 s each, IPv4 and IPv6
#   ROUNDS=1 DURATION=5 FAMILIES=ipv4 KINDS="h2-tls h1" benches/load/h2-bench.sh
#   SERVERS=duet KINDS="h2-tls h3" benches/load/h2-bench.sh   # HTTP/3 beside HTTP/2 over TLS
#
# Each server terminates TLS (the same ECDSA P-256 certificate, ALPN h2) on 127.0.0.1 and [::1]
# and proxies Host `bench.example` over HTTP/1.1 keep-alive to one duet-echo pod of the client's
# family: duet (release, one Tokio worker, metrics on, access log off) through an Ingress and a
# dual-stack Service; nginx (one worker, access log off, `keepalive 64`, the same forwarding
# headers). The server is pinned to core CORE_SERVER (0), h2load (20 connections x 10 streams,
# one thread) and the pod to CORE_LOAD (1). Rounds interleave the servers; each run starts a
# fresh server, warms up WARMUP s, then loads DURATION s and reads the server's CPU time
# (utime + stime of all its threads, /proc) over that window. Printed per run and, at the end,
# as medians with duet's ratio to nginx; the CPU time is split into user and system (kernel)
# time, and with `perf` installed the server's syscalls are counted over the same window
# (ACCESS_LOG=json: both servers write a JSON access log line per request to a file)
# (`perf stat -e raw_syscalls:sys_enter`; SYSCALLS=0 skips it):
#   duet h2-tls ipv4 round 1: 41234 requests/s, CPU 23.1 us/request (user 9.0, system 14.1), 4.1 syscalls/request
#   median h2-tls ipv4: duet 23.1 us/request (user 9.0, system 14.1), nginx 18.2 (user 5.1, system 13.1), ratio 1.27
# SERVERS="duet nginx floor" KINDS=h1 adds benches/floor-relay (`cargo build --release -p
# floor-relay`): one upstream connection per client connection and the bytes relayed as they come,
# nothing parsed or added, one read and one write each way per request. No proxy can spend less
# CPU per request on this kernel's socket API, so its ratio to nginx is the least any proxy can
# reach in the same run. HTTP/1.1 only.
# Fails (exit 1) when a server does not start or any request is not answered 2xx.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10}
WARMUP=${WARMUP:-2}
FAMILIES=${FAMILIES:-"ipv4 ipv6"}
KINDS=${KINDS:-h2-tls}
ACCESS_LOG=${ACCESS_LOG:-off}
[[ $ACCESS_LOG == off || $ACCESS_LOG == json ]] || die "ACCESS_LOG is off or json"
SERVERS=${SERVERS:-"duet nginx"}
CORE_SERVER=${CORE_SERVER:-0}
CORE_LOAD=${CORE_LOAD:-1}

need h2load curl python3 openssl taskset nginx
SYSCALLS=${SYSCALLS:-$(command -v perf >/dev/null && echo 1 || echo 0)}
[[ $SYSCALLS == 1 ]] && need perf
DUET=$(duet_bin)
[[ " $SERVERS " == *" floor "* ]] && FLOOR=$(floor_bin)
[[ " $KINDS " == *" h3 "* ]] && H3LOAD=$(h3load_bin)
CLK_TCK=$(getconf CLK_TCK)
make_work h2bench
make_cert "$WORK"
read -r ECHO_PORT HTTP_PORT HTTPS_PORT ADMIN_PORT DEBUG_PORT < <(free_ports 5)
ECHO_BIN=$(echo_bin)
taskset -c "$CORE_LOAD" "$ECHO_BIN" --quiet --pod "upstream-0=127.0.0.1:$ECHO_PORT,[::1]:$ECHO_PORT" \
  --namespace bench --service upstream >/dev/null 2>&1 &
STARTED_PIDS+=($!)
wait_200 "http://127.0.0.1:$ECHO_PORT/" 30 $!
wait_200 "http://[::1]:$ECHO_PORT/" 30 $!
mkdir -p "$WORK/manifests"
write_proxy_manifests "$WORK/manifests" "$ECHO_PORT" "$WORK"

# Starts duet pinned to the server core, with --http3 for KIND h3; sets SERVER_PID.
start_duet() {
  local -a http3=()
  [[ $1 == h3 ]] && http3=(--http3)
  TOKIO_WORKER_THREADS=1 DUET_LOG=warn taskset -c "$CORE_SERVER" "$DUET" serve \
    --manifests "$WORK/manifests" --access-log "$ACCESS_LOG" "${http3[@]}" \
    --https-listen "127.0.0.1:$HTTPS_PORT" --https-listen "[::1]:$HTTPS_PORT" \
    --http-listen "127.0.0.1:$HTTP_PORT" --http-listen "[::1]:$HTTP_PORT" \
    --admin-listen "127.0.0.1:$ADMIN_PORT" \
    --debug-listen "127.0.0.1:$DEBUG_PORT" \
    --default-tls-secret bench/bench-tls --shutdown-delay 0 --drain-timeout 1s \
    >"$WORK/duet.out" 2>"$WORK/duet.err" &
  SERVER_PID=$!
  STARTED_PIDS+=("$SERVER_PID")
  wait_200 "http://127.0.0.1:$ADMIN_PORT/readyz" 30 "$SERVER_PID" "$WORK/duet.err"
}

# Starts nginx (one worker, master in the foreground) pinned to the server core; sets
# SERVER_PID to the worker and SERVER_MAIN to the master.
start_nginx() {
  write_nginx_conf "$WORK/nginx" "$ECHO_PORT" "$HTTPS_PORT" "$HTTP_PORT" "$WORK" \
    "error_log $WORK/nginx/error.log warn;
events { worker_connections 1024; }" \
    "$NGINX_JSON_LOG_FORMAT
  access_log $([[ $ACCESS_LOG == json ]] && echo "$WORK/nginx/access.log json" || echo off);
  keepalive_requests 10000000;
  http2_max_requests 10000000;"
  taskset -c "$CORE_SERVER" nginx -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" -g 'daemon off;' \
    2>"$WORK/nginx/stderr" &
  SERVER_MAIN=$!
  STARTED_PIDS+=("$SERVER_MAIN")
  local tries=0
  until [[ $(curl -sk -o /dev/null -w '%{http_code}' --resolve "bench.example:$HTTPS_PORT:127.0.0.1" \
    "https://bench.example:$HTTPS_PORT/") == 200 ]]; do
    kill -0 "$SERVER_MAIN" 2>/dev/null || die "nginx did not start: $(cat "$WORK/nginx/stderr")"
    ((tries++ < 300)) || die "nginx not answering"
    sleep 0.1
  done
  SERVER_PID=$(pgrep -P "$SERVER_MAIN" | head -1)
}

# Starts floor-relay (benches/floor-relay: bytes relayed, nothing parsed) pinned to the server
# core on the HTTP/1.1 port of both families; sets SERVER_PID. HTTP/1.1 only (no TLS).
start_floor() {
  taskset -c "$CORE_SERVER" "$FLOOR" --listen "127.0.0.1:$HTTP_PORT" --listen "[::1]:$HTTP_PORT" \
    --upstream "127.0.0.1:$ECHO_PORT" --upstream "[::1]:$ECHO_PORT" 2>"$WORK/floor.err" &
  SERVER_PID=$!
  STARTED_PIDS+=("$SERVER_PID")
  wait_200 "http://127.0.0.1:$HTTP_PORT/" 30 "$SERVER_PID" "$WORK/floor.err"
}

# CPU ticks of PID (every thread): user and system (kernel) time.
ticks() {
  awk '{sub(/^.*\) /, ""); print $12, $13}' "/proc/$1/stat"
}

# h2load for SECONDS against KIND and FAMILY; prints the requests answered 2xx (fails unless
# all were).
h2load_run() {
  local kind=$1 family=$2 seconds=$3 host=127.0.0.1 out
  [[ $family == ipv6 ]] && host='[::1]'
  if [[ $kind == h3 ]]; then
    out=$(taskset -c "$CORE_LOAD" "$H3LOAD" -t 1 -c 20 -m 10 -D "$seconds" \
      --sni bench.example "https://$host:$HTTPS_PORT/" 2>&1) || die "h3load failed: $out"
    # Every request sent was answered 2xx (h3load fails otherwise).
    awk '/^requests:/ {print $2}' <<<"$out"
    return
  elif [[ $kind == h1 ]]; then
    out=$(taskset -c "$CORE_LOAD" h2load --h1 -t 1 -c 50 -m 1 -D "$seconds" \
      -H ':authority: bench.example' "http://$host:$HTTP_PORT/" 2>&1) || die "h2load failed: $out"
  else
    out=$(taskset -c "$CORE_LOAD" h2load -t 1 -c 20 -m 10 -D "$seconds" \
      -H ':authority: bench.example' "https://$host:$HTTPS_PORT/" 2>&1) || die "h2load failed: $out"
  fi
  local answered ok
  answered=$(awk '/^requests:/ {print $8}' <<<"$out")
  ok=$(awk '/^status codes:/ {print $3}' <<<"$out")
  # A timed run counts in its status codes the answers that arrive after its end, not in
  # "succeeded": at least every succeeded request answered 2xx.
  [[ -n $answered && -n $ok && $answered -gt 0 && $ok -ge $answered ]] || die "$kind $family: $answered requests succeeded, ${ok:-0} answered 2xx: $out"
  echo "$answered"
}

declare -A RESULTS=()
note "duet $DUET; $(nginx -v 2>&1); $(nproc) cores; $ROUNDS rounds of ${DURATION}s; access log $ACCESS_LOG; $(date -u +%FT%TZ)"
for round in $(seq "$ROUNDS"); do
  for kind in $KINDS; do
    for server in $SERVERS; do
      if [[ $server == floor && $kind != h1 ]]; then
        note "floor: $kind not measured (floor-relay relays HTTP/1.1 without TLS)"
        continue
      fi
      if [[ $server == nginx && $kind == h3 ]]; then
        note "nginx: h3 not measured (Debian's nginx 1.22.1 is built without QUIC/HTTP/3)"
        continue
      fi
      for family in $FAMILIES; do
        "start_$server" "$kind"
        h2load_run "$kind" "$family" "$WARMUP" >/dev/null
        perf_pid=""
        if [[ $SYSCALLS == 1 ]]; then
          perf stat -e raw_syscalls:sys_enter -x, -o "$WORK/perf.$server" -p "$SERVER_PID" &
          perf_pid=$!
          sleep 0.2
        fi
        read -r user0 sys0 < <(ticks "$SERVER_PID")
        requests=$(h2load_run "$kind" "$family" "$DURATION")
        read -r user1 sys1 < <(ticks "$SERVER_PID")
        syscalls=""
        if [[ -n $perf_pid ]]; then
          kill -INT "$perf_pid"
          wait "$perf_pid" 2>/dev/null || true
          syscalls=$(awk -F, '/raw_syscalls:sys_enter/ {print $1}' "$WORK/perf.$server")
        fi
        line=$(python3 - "$((user1 - user0))" "$((sys1 - sys0))" "$requests" "$CLK_TCK" "$DURATION" "$syscalls" <<'PY'
import sys
user, system, n, hz, seconds = map(int, sys.argv[1:6])
calls = sys.argv[6]
us = lambda t: t * 1e6 / hz / n
# perf counts the whole window (a little longer than the load); scale by the rate.
per = f", {int(calls) / (n / seconds) / (seconds + 0.2):.1f} syscalls/request" if calls.isdigit() else ""
print(f"{us(user + system):.1f} {us(user):.1f} {us(system):.1f}|{n // seconds} requests/s, CPU {us(user + system):.1f} us/request (user {us(user):.1f}, system {us(system):.1f}){per}")
PY
        )
        echo "$server $kind $family round $round: ${line#*|}"
        RESULTS[$server.$kind.$family]+="${line%%|*};"
        kill -TERM "${SERVER_MAIN:-$SERVER_PID}"
        wait "${SERVER_MAIN:-$SERVER_PID}" 2>/dev/null || true
        unset SERVER_MAIN
      done
    done
  done
done
for kind in $KINDS; do
  for family in $FAMILIES; do
    for server in $SERVERS; do
      [[ $server == nginx ]] && continue
      [[ -n ${RESULTS[$server.$kind.$family]:-} ]] || continue
      python3 - "$kind $family" "$server" "${RESULTS[$server.$kind.$family]}" "${RESULTS[nginx.$kind.$family]:-}" <<'PY'
import statistics, sys
what, name = sys.argv[1:3]
def medians(runs):
    rows = [list(map(float, r.split())) for r in runs.split(";") if r]
    return [statistics.median(col) for col in zip(*rows)] if rows else None
d, n = medians(sys.argv[3]), medians(sys.argv[4])
fmt = lambda m: "-" if m is None else f"{m[0]:.1f} us/request (user {m[1]:.1f}, system {m[2]:.1f})"
ratio = f", ratio {d[0] / n[0]:.2f} (user {d[1] / n[1]:.2f}, system {d[2] / n[2]:.2f})" if d and n and n[1] and n[2] else ""
print(f"median {what}: {name} {fmt(d)}, nginx {fmt(n)}{ratio}")
PY
    done
  done
done
