#!/usr/bin/env bash
# instructions.sh — user-space instructions duet executes per proxied request, counted by
# valgrind's callgrind (exact and repeatable on a noisy machine, unlike time), and optionally
# syscalls per request (strace -c). Loopback only.
#
#   cargo build --profile dist -p controller --bin duet && cargo build -p conformance --bin duet-echo
#   benches/load/instructions.sh          # N=5000 per HTTP/1.1 family, N_H2=20000 per HTTP/2 one,
#                                         # access log off and on
#   N=2000 FAMILIES="ipv4 ipv6" ACCESS_LOGS=off SYSCALLS=1 benches/load/instructions.sh
#   cargo build --release -p h3load
#   N=2000 FAMILIES="h2-tls-ipv4 h2-tls-ipv6 h3-ipv4 h3-ipv6" ACCESS_LOGS=off benches/load/instructions.sh
#
# Setup: duet-echo serves one dual-stack pod on 127.0.0.1:P and [::1]:P; duet (release,
# DUET_BIN overrides; one Tokio worker, metrics on as always) routes Host `bench.example` to it
# through an Ingress, a dual-stack Service and its IPv4 and IPv6 EndpointSlices. h2load runs
# outside valgrind and sends N (HTTP/2: N_H2) requests per family:
#   ipv4, ipv6:         HTTP/1.1 keep-alive, one connection (h2load --h1 -c 1), plain HTTP
#   h2-tls-ipv4/-ipv6:  HTTP/2 over TLS (ALPN h2), 20 connections x 10 streams (h2load -c 20 -m 10)
#   h3-ipv4/-ipv6:      HTTP/3 (QUIC, ALPN h3), 20 connections x 10 streams, N_H2 requests, with
#                       h3load (benches/h3load: Debian's h2load has no HTTP/3), duet started with
#                       --http3 (UDP on the HTTPS port), its baseline too; nginx is skipped
#                       (Debian's nginx 1.22.1 is built without QUIC)
# The proxy->upstream leg is HTTP/1.1 keep-alive over the client's family. Every family runs in a
# fresh duet under callgrind: started, ready (its "Snapshot applied" log line, then one /readyz),
# loaded, stopped with SIGTERM (--shutdown-delay 0). A baseline run (start, ready, stop: N=0) is
# subtracted and the rest divided by N:
#   duet ipv4 access-log=off: 45678 instructions/request
# SERVERS="duet nginx" measures nginx the same way (one process, master_process off; the same
# route, pod, certificate, forwarding headers and load; its readiness is its listening socket,
# so its baseline has no request; access log json: a JSON line per request to a file).
# The figure counts every thread of duet (the access-log writer too) and user space only: the
# kernel's share (TCP, wakeups; about half of a request's time, ARCHITECTURE.md section 8) is what
# SYSCALLS=1 counts (duet natively under `strace -f -c`, the same runs, same subtraction).
# HTTP/2 and HTTP/3 figures include 20 TLS handshakes (ECDSA P-256 self-signed default
# certificate) spread over N_H2.
# Fails (exit 1) when a tool or binary is missing, duet does not become ready, or fewer than N
# requests get a 2xx.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

N=${N:-5000}
N_H2=${N_H2:-$((4 * N))} # more, so the 20 TLS handshakes weigh little
FAMILIES=${FAMILIES:-"ipv4 ipv6 h2-tls-ipv4 h2-tls-ipv6"}
ACCESS_LOGS=${ACCESS_LOGS:-"off json"}
SERVERS=${SERVERS:-duet} # "duet nginx": nginx 1 process, same routes, pod, certificate and load
SYSCALLS=${SYSCALLS:-0}
READY_TIMEOUT=${READY_TIMEOUT:-180}

need valgrind h2load curl python3 openssl ss
[[ $SYSCALLS == 1 ]] && need strace
[[ $SERVERS == *nginx* ]] && need nginx
DUET=$(duet_bin)
[[ " $FAMILIES " == *" h3-"* ]] && H3LOAD=$(h3load_bin)
make_work instr
read -r ECHO_PORT HTTP_PORT HTTPS_PORT ADMIN_PORT DEBUG_PORT < <(free_ports 5)
start_echo "$ECHO_PORT"
mkdir -p "$WORK/manifests"
make_cert "$WORK"
write_proxy_manifests "$WORK/manifests" "$ECHO_PORT" "$WORK"

# The command prefix of WRAPPER (callgrind or strace) writing to OUT.
wrapper_cmd() {
  case $1 in
    callgrind) WRAP=(valgrind --tool=callgrind --callgrind-out-file="$2" --dump-instr=no) ;;
    strace) WRAP=(strace -f -c -o "$2") ;;
  esac
}

# Starts duet under WRAPPER writing to OUT, with --http3 for the h3 families (and their
# baseline, h3-none); sets SERVER_PID.
start_duet() {
  local wrapper=$1 out=$2 access_log=$3 log=$4 family=$5
  local -a http3=()
  [[ $family == h3* ]] && http3=(--http3)
  wrapper_cmd "$wrapper" "$out"
  TOKIO_WORKER_THREADS=1 DUET_LOG=info "${WRAP[@]}" "$DUET" serve --manifests "$WORK/manifests" \
    --access-log "$access_log" "${http3[@]}" \
    --http-listen "127.0.0.1:$HTTP_PORT" --http-listen "[::1]:$HTTP_PORT" \
    --https-listen "127.0.0.1:$HTTPS_PORT" --https-listen "[::1]:$HTTPS_PORT" \
    --admin-listen "127.0.0.1:$ADMIN_PORT" --debug-listen "127.0.0.1:$DEBUG_PORT" \
    --default-tls-secret bench/bench-tls --shutdown-delay 0 --drain-timeout 5s \
    >"$log.out" 2>"$log.err" &
  SERVER_PID=$!
  STARTED_PIDS+=("$SERVER_PID")
}

# Starts nginx (one process: master_process off) under WRAPPER writing to OUT; sets SERVER_PID.
# Like duet: HTTP/1.1 keep-alive upstream of the client's family, forwarding headers, TLS with
# ALPN h2, access log off or JSON lines to a file.
start_nginx() {
  local wrapper=$1 out=$2 access_log=$3 log=$4 logline="access_log off;"
  [[ $access_log == json ]] && logline="access_log $log.out json;"
  write_nginx_conf "$log.nginx" "$ECHO_PORT" "$HTTPS_PORT" "$HTTP_PORT" "$WORK" \
    "daemon off;
master_process off;
error_log $log.err notice;
events { worker_connections 1024; }" \
    "$NGINX_JSON_LOG_FORMAT
  $logline
  keepalive_requests 10000000;"
  wrapper_cmd "$wrapper" "$out"
  "${WRAP[@]}" nginx -p "$log.nginx" -c "$log.nginx/nginx.conf" >/dev/null 2>"$log.stderr" &
  SERVER_PID=$!
  STARTED_PIDS+=("$SERVER_PID")
}

# duet: waits for its "Snapshot applied" line, then checks /readyz once (the same in every run).
# nginx: waits until it listens on the HTTPS port (no request, so nothing to subtract).
wait_ready() {
  local pid=$1 log=$2 waited=0
  until if [[ $SERVER == duet ]]; then grep -qs "Snapshot applied" "$log.err"; else
    [[ -n $(ss -Htln "( sport = :$HTTPS_PORT )") ]]; fi; do
    kill -0 "$pid" 2>/dev/null || die "$SERVER exited before it was ready; its log: $(tail -5 "$log.err" "$log.stderr" 2>/dev/null)"
    ((waited++ < READY_TIMEOUT * 10)) || die "$SERVER not ready within ${READY_TIMEOUT}s"
    sleep 0.1
  done
  if [[ $SERVER == duet ]]; then
    [[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$ADMIN_PORT/readyz") == 200 ]] ||
      die "duet logged its snapshot but /readyz is not 200"
  fi
}

# Sends N requests of FAMILY with h2load; fails unless all N got a 2xx.
load() {
  local family=$1 n=$2 out
  local -a args
  case $family in
    ipv4) args=(--h1 -c 1 -H ':authority: bench.example' "http://127.0.0.1:$HTTP_PORT/") ;;
    ipv6) args=(--h1 -c 1 -H ':authority: bench.example' "http://[::1]:$HTTP_PORT/") ;;
    h2-tls-ipv4) args=(-c 20 -m 10 -H ':authority: bench.example' "https://127.0.0.1:$HTTPS_PORT/") ;;
    h2-tls-ipv6) args=(-c 20 -m 10 -H ':authority: bench.example' "https://[::1]:$HTTPS_PORT/") ;;
    h3-ipv4 | h3-ipv6)
      local host=127.0.0.1
      [[ $family == h3-ipv6 ]] && host='[::1]'
      out=$("$H3LOAD" -n "$n" -t 1 -c 20 -m 10 --sni bench.example "https://$host:$HTTPS_PORT/" 2>&1) ||
        die "h3load failed for $family: $out"
      [[ $(awk '/^requests:/ {print $4}' <<<"$out") == "$n" ]] || die "$family: $n requests sent, not all 2xx; h3load said: $out"
      return
      ;;
    *) die "unknown family $family" ;;
  esac
  out=$(h2load -n "$n" -t 1 "${args[@]}" 2>&1) || die "h2load failed for $family: $out"
  local ok
  ok=$(awk '/^status codes:/ {print $3}' <<<"$out")
  [[ $ok == "$n" ]] || die "$family: $n requests sent, ${ok:-0} answered 2xx; h2load said: $out"
}

# Stops the server with SIGTERM (nginx: SIGQUIT, a graceful stop) and waits for it (and for
# strace, which blocks the signal) to exit 0.
stop_server() {
  local pid=$1 log=$2 child signal=TERM
  [[ $SERVER == nginx ]] && signal=QUIT
  # Under strace the server is strace's only child (whatever its binary is called).
  child=$(pgrep -P "$pid" | head -1 || true)
  kill "-$signal" "${child:-$pid}"
  wait "$pid" || die "$SERVER exited with $? on SIG$signal; its log: $(tail -5 "$log.err")"
}

# One run: start under WRAPPER, ready, N requests of FAMILY (none for N=0), stop; sets COUNT
# (instructions for callgrind, syscalls for strace). Runs in this shell, so a failure stops duet.
run_once() {
  local wrapper=$1 family=$2 n=$3 access_log=$4 out
  out="$WORK/$SERVER.$wrapper.$family.$n.$access_log"
  "start_$SERVER" "$wrapper" "$out" "$access_log" "$out" "$family"
  wait_ready "$SERVER_PID" "$out"
  if ((n > 0)); then load "$family" "$n"; fi
  stop_server "$SERVER_PID" "$out"
  case $wrapper in
    callgrind) COUNT=$(awk '/^(summary|totals):/ {print $2; exit}' "$out") ;;
    strace) COUNT=$(awk '$NF == "total" {print $4}' "$out") ;;
  esac
  [[ $COUNT =~ ^[0-9]+$ ]] || die "no $wrapper total in $out"
}

per_request() {
  python3 -c "import sys; t, b, n = map(int, sys.argv[1:]); print(f'{(t - b) / n:.{1 if t - b < 100 * n else 0}f}')" "$@"
}

note "duet $DUET, upstream duet-echo on port $ECHO_PORT, N=$N, N_H2=$N_H2, $(nproc) cores, $(date -u +%FT%TZ)"
for SERVER in $SERVERS; do
  for access_log in $ACCESS_LOGS; do
    # Baselines by mode: tcp, or h3 (duet with --http3), run before the first family of the mode.
    declare -A base=() sbase=()
    for family in $FAMILIES; do
      mode=tcp
      if [[ $family == h3* ]]; then
        if [[ $SERVER == nginx ]]; then
          note "nginx $family: skipped (Debian's nginx 1.22.1 is built without QUIC/HTTP/3)"
          continue
        fi
        mode=h3
      fi
      if [[ -z ${base[$mode]:-} ]]; then
        run_once callgrind "$mode-none" 0 "$access_log"
        base[$mode]=$COUNT
        note "$SERVER baseline $mode access-log=$access_log: $COUNT instructions (start, ready, stop)"
        if [[ $SYSCALLS == 1 ]]; then
          run_once strace "$mode-none" 0 "$access_log"
          sbase[$mode]=$COUNT
        fi
      fi
      n=$N
      [[ $family == h2* || $family == h3* ]] && n=$N_H2
      run_once callgrind "$family" "$n" "$access_log"
      total=$COUNT
      line="$SERVER $family access-log=$access_log: $(per_request "$total" "${base[$mode]}" "$n") instructions/request"
      if [[ $SYSCALLS == 1 ]]; then
        run_once strace "$family" "$n" "$access_log"
        stotal=$COUNT
        line+=", $(per_request "$stotal" "${sbase[$mode]}" "$n") syscalls/request"
      fi
      echo "$line"
    done
  done
done
