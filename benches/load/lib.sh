# Shared helpers of the load scripts in this folder (sourced, not run). Loopback only.
# shellcheck shell=bash

LOAD_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$LOAD_DIR/../.." && pwd)
STARTED_PIDS=()
TMP_DIRS=()
CLEANUP_HOOKS=() # commands run at exit, once the started processes are gone

die() {
  echo "FAIL: $*" >&2
  exit 1
}

note() {
  echo "# $*" >&2
}

# Stops what this script started (by pid) and removes its temp folders.
cleanup() {
  local pid hook
  for pid in "${STARTED_PIDS[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${STARTED_PIDS[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  for hook in "${CLEANUP_HOOKS[@]}"; do
    eval "$hook" || true
  done
  if [[ ${KEEP_TMP:-0} != 1 ]]; then
    local dir
    for dir in "${TMP_DIRS[@]}"; do
      rm -rf "$dir"
    done
  fi
}
trap cleanup EXIT

# Makes a temp folder (removed at exit unless KEEP_TMP=1) and sets WORK to it.
make_work() {
  WORK=$(mktemp -d "/tmp/duet-load-$1.XXXXXX")
  TMP_DIRS+=("$WORK")
}

need() {
  local tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null || die "$tool is not installed (${INSTALL_HINT:-apt-get install it})"
  done
}

# The duet binary as it ships, built with the `dist` profile (DUET_BIN overrides).
duet_bin() {
  local bin=${DUET_BIN:-$REPO_ROOT/target/dist/duet}
  [[ -x $bin ]] || die "no duet binary at $bin: run 'cargo build --profile dist -p controller --bin duet' (or set DUET_BIN)"
  echo "$bin"
}

# duet-echo, the upstream (ECHO_BIN overrides; release if built, else debug: its speed does not
# enter duet's figures).
echo_bin() {
  local bin
  for bin in ${ECHO_BIN:-} "$REPO_ROOT/target/release/duet-echo" "$REPO_ROOT/target/debug/duet-echo"; do
    if [[ -x $bin ]]; then
      echo "$bin"
      return
    fi
  done
  die "no duet-echo binary: run 'cargo build -p conformance --bin duet-echo' (or set ECHO_BIN)"
}

# floor-relay, the byte relay whose CPU per request is the least a proxy can spend (FLOOR_BIN
# overrides).
floor_bin() {
  local bin=${FLOOR_BIN:-$REPO_ROOT/target/release/floor-relay}
  [[ -x $bin ]] || die "no floor-relay binary at $bin: run 'cargo build --release -p floor-relay' (or set FLOOR_BIN)"
  echo "$bin"
}

# h3load, the HTTP/3 load generator of benches/h3load (H3LOAD_BIN overrides): Debian's h2load
# has no HTTP/3.
h3load_bin() {
  local bin=${H3LOAD_BIN:-$REPO_ROOT/target/release/h3load}
  [[ -x $bin ]] || die "no h3load binary at $bin: run 'cargo build --release -p h3load' (or set H3LOAD_BIN)"
  echo "$bin"
}

# Prints COUNT distinct TCP ports that are free on both 127.0.0.1 and [::1], outside the kernel's
# ephemeral range: a script starts and stops servers on them for minutes, while its clients' and
# proxies' outgoing connections take ephemeral ports (one took a debug listener's port between two
# rounds of h2-bench.sh).
free_ports() {
  python3 - "$1" <<'PY'
import random, socket, sys
count, found = int(sys.argv[1]), []
try:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low, high = map(int, f.read().split())
except (OSError, ValueError):
    low, high = 32768, 60999
candidates = [p for p in range(10000, 65000) if not low <= p <= high] or list(range(20000, 60000))
while len(found) < count:
    port = random.choice(candidates)
    if port in found:
        continue
    try:
        for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
            s = socket.socket(family, socket.SOCK_STREAM)
            s.bind((host, port))
            s.close()
    except OSError:
        continue
    found.append(port)
print(" ".join(map(str, found)))
PY
}

# Waits until URL answers 200 (curl; both families work: pass [::1] bracketed); TIMEOUT seconds;
# fails at once if PID exits first (with the end of LOG, when given).
wait_200() {
  local url=$1 timeout=${2:-30} pid=${3:-} log=${4:-} start
  start=$(date +%s)
  until [[ $(curl -s -o /dev/null -w '%{http_code}' "$url") == 200 ]]; do
    if [[ -n $pid ]] && ! kill -0 "$pid" 2>/dev/null; then
      die "process $pid exited before $url answered 200${log:+; the end of $log: $(tail -5 "$log" 2>/dev/null)}"
    fi
    (($(date +%s) - start < timeout)) || die "$url did not answer 200 within ${timeout}s"
    sleep 0.01
  done
}

# Wall-clock time in seconds (fractional); seconds from the first time to the second, printed
# with DIGITS decimals (default 3); whether less than LIMIT seconds have passed since a time.
now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.{sys.argv[3]}f}')" "$1" "$2" "${3:-3}"; }
within() { awk -v a="$1" -v b="$(now)" -v l="$2" 'BEGIN {exit !(b - a < l)}'; }

# KiB as MiB with one decimal.
mib() { python3 -c "import sys; print(f'{int(sys.argv[1]) / 1024:.1f}')" "$1"; }

# Resident set size of PID in KiB.
rss_kib() {
  awk '/^VmRSS:/ {print $2}' "/proc/$1/status"
}

# Waits until duet (PID) answers 200 on ADMIN/readyz, at most TIMEOUT seconds after START (a
# `now` value); dies, with the end of ERR_LOG, if duet exits first.
wait_readyz() {
  local pid=$1 admin=$2 start=$3 timeout=$4 err_log=$5
  until [[ $(curl -s -o /dev/null -w '%{http_code}' "$admin/readyz") == 200 ]]; do
    kill -0 "$pid" 2>/dev/null || die "duet exited before it was ready: $(tail -5 "$err_log")"
    within "$start" "$timeout" || die "/readyz not 200 within ${timeout}s"
    sleep 0.01
  done
}

# User plus system CPU seconds of the processes PID... so far, summed (/proc/PID/stat, clock
# ticks; a process gone meanwhile counts nothing).
cpu_seconds() {
  python3 -c "
import os, sys
total = 0
for pid in sys.argv[1:]:
    try:
        fields = open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()
    except OSError:
        continue
    total += int(fields[11]) + int(fields[12])
print(f'{total / os.sysconf(\"SC_CLK_TCK\"):.2f}')
" "$@"
}

# Prints the time (seconds since the epoch) /readyz on 127.0.0.1:PORT first answers 200, polled
# every 10 ms by one python3 process: wait_readyz runs curl, kill, awk, date and sleep per poll,
# about 15 ms of CPU each time, which on a 2-core machine took a third of the CPU duet's start
# had. Exits non-zero (with a reason on stderr) if PID exits first or TIMEOUT seconds pass. A
# command given after the three arguments runs python3 (e.g. `nsenter --net=NS`).
ready_time() {
  local pid=$1 port=$2 timeout=$3
  shift 3
  "$@" python3 - "$pid" "$port" "$timeout" <<'PY'
import http.client, os, sys, time
pid, port, timeout = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
start = time.time()
while True:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/readyz")
        status = conn.getresponse().status
        conn.close()
        if status == 200:
            print(f"{time.time():.6f}")
            sys.exit(0)
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit("duet exited before it was ready")
    if time.time() - start > timeout:
        sys.exit(f"/readyz not 200 within {timeout}s")
    time.sleep(0.01)
PY
}

# The value of a metric series (exact name incl. labels, or a bare name) from a /metrics URL.
metric() {
  curl -sf "$1" | awk -v name="$2" '$1 == name {print $2; found=1} END {exit !found}' ||
    die "metric $2 not found at $1"
}

# Writes the manifests of one dual-stack pod at 127.0.0.1:PORT and [::1]:PORT behind the Ingress
# host `bench.example` (path / Prefix) into DIR, like a production route: host routing, family
# choice, forwarding headers. With a third argument (a folder holding tls.crt and tls.key) the
# Ingress also lists the host under spec.tls with that Secret.
write_proxy_manifests() {
  local dir=$1 port=$2 tls=${3:-}
  cat >"$dir/bench.yaml" <<YAML
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: duet}
spec: {controller: duet.dev/ingress-controller}
---
apiVersion: v1
kind: Service
metadata: {name: upstream, namespace: bench}
spec:
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  ports: [{name: http, port: 80, targetPort: $port}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: upstream-ipv4
  namespace: bench
  labels: {kubernetes.io/service-name: upstream}
addressType: IPv4
ports: [{name: http, port: $port}]
endpoints:
  - addresses: ["127.0.0.1"]
    targetRef: {kind: Pod, namespace: bench, name: upstream-0, uid: 00000000-0000-4000-8000-000000000001}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: upstream-ipv6
  namespace: bench
  labels: {kubernetes.io/service-name: upstream}
addressType: IPv6
ports: [{name: http, port: $port}]
endpoints:
  - addresses: ["::1"]
    targetRef: {kind: Pod, namespace: bench, name: upstream-0, uid: 00000000-0000-4000-8000-000000000001}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: bench, namespace: bench, annotations: {duet.dev/ssl-redirect: "false"}}
spec:
  ingressClassName: duet
  rules:
    - host: bench.example
      http:
        paths:
          - {path: /, pathType: Prefix, backend: {service: {name: upstream, port: {name: http}}}}
YAML
  if [[ -n $tls ]]; then
    cat >>"$dir/bench.yaml" <<YAML
  tls:
    - {hosts: [bench.example], secretName: bench-tls}
---
apiVersion: v1
kind: Secret
metadata: {name: bench-tls, namespace: bench}
type: kubernetes.io/tls
data:
  tls.crt: $(base64 -w0 "$tls/tls.crt")
  tls.key: $(base64 -w0 "$tls/tls.key")
YAML
  fi
}

# Writes DIR/nginx.conf: nginx as the load scripts compare it with duet, one worker proxying Host
# `bench.example` over HTTP/1.1 keep-alive (`keepalive 320`, as duet and ingress-nginx) to the
# duet-echo pod on ECHO_PORT of the client's family with duet's forwarding headers; TLS (CERT_DIR's
# tls.crt and tls.key, ALPN h2) on 127.0.0.1 and [::1] port HTTPS_PORT, plain HTTP on HTTP_PORT too
# unless it is empty. MAIN: lines of the main context (at least `events`; error_log, daemon, ...);
# HTTP: lines of the http context (at least access_log).
write_nginx_conf() {
  local dir=$1 echo_port=$2 https_port=$3 http_port=$4 cert_dir=$5 main=$6 http=$7 plain=""
  [[ -n $http_port ]] && plain="listen 127.0.0.1:$http_port;
    listen [::1]:$http_port;"
  mkdir -p "$dir"
  cat >"$dir/nginx.conf" <<CONF
user root;
worker_processes 1;
pid $dir/nginx.pid;
$main
http {
  $http
  client_body_temp_path $dir/body;
  proxy_temp_path $dir/proxy;
  upstream echo4 { server 127.0.0.1:$echo_port; keepalive 320; }
  upstream echo6 { server [::1]:$echo_port; keepalive 320; }
  map \$server_addr \$echo { ~: echo6; default echo4; }
  server {
    $plain
    listen 127.0.0.1:$https_port ssl http2;
    listen [::1]:$https_port ssl http2;
    server_name bench.example;
    ssl_certificate $cert_dir/tls.crt;
    ssl_certificate_key $cert_dir/tls.key;
    location / {
      proxy_pass http://\$echo;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
      proxy_set_header X-Real-IP \$remote_addr;
      proxy_set_header X-Forwarded-Proto \$scheme;
    }
  }
}
CONF
}

# nginx's `log_format json`: the fields of duet's JSON access log line (`--access-log json`).
NGINX_JSON_LOG_FORMAT="log_format json escape=json '{\"time\":\"\$time_iso8601\",\"client_addr\":\"\$remote_addr\",\"client_port\":\$remote_port,\"host\":\"\$host\",\"method\":\"\$request_method\",\"path\":\"\$uri\",\"protocol\":\"\$server_protocol\",\"status\":\$status,\"bytes\":\$body_bytes_sent,\"duration_seconds\":\$request_time,\"upstream_addr\":\"\$upstream_addr\",\"upstream_response_seconds\":\"\$upstream_response_time\"}';"

# Writes an ECDSA P-256 self-signed certificate for bench.example into DIR (tls.crt, tls.key).
make_cert() {
  need openssl
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj /CN=bench.example -addext subjectAltName=DNS:bench.example \
    -keyout "$1/tls.key" -out "$1/tls.crt" 2>/dev/null || die "openssl could not make a certificate"
}

# Starts duet-echo serving one pod on 127.0.0.1:PORT and [::1]:PORT; waits until it answers.
start_echo() {
  local port=$1 bin
  bin=$(echo_bin)
  "$bin" --quiet --pod "upstream-0=127.0.0.1:$port,[::1]:$port" --namespace bench \
    --service upstream >/dev/null 2>&1 &
  STARTED_PIDS+=($!)
  wait_200 "http://127.0.0.1:$port/" 30 $!
  wait_200 "http://[::1]:$port/" 30 $!
}
