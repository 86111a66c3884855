#!/usr/bin/env bash
# scale-check.sh — the release duet on a 10k-Ingress / 100k-pod folder written as a new user's is
# (user-folder.py, in each layout), checked against the scale goals: ready time, memory, the first
# snapshot build, and how soon an EndpointSlice change serves. Loopback only: the only pod ever
# contacted is the probe's, a duet-echo.
#
#   cargo build --profile dist -p controller --bin duet && cargo build -p conformance --bin duet-echo
#   benches/load/scale-check.sh                               # object, namespace and huge layouts, 1 run each
#   RUNS=3 LAYOUTS=object benches/load/scale-check.sh
#   INGRESSES=1000 benches/load/scale-check.sh                # smaller folders
#
# Each layout's folder is generated once (user-folder.py --layout L), then per run duet starts on
# it (`duet serve --manifests`), and one "layout run name: value" line is printed per figure:
#   ready_s           start to the first /readyz 200 (one python3 process polling every 10 ms)
#   cpu_ready_s       duet's user + system CPU when ready
#   rss_ready_mib     VmRSS when ready; rss_settled_mib 5 s later; rss_peak_mib VmHWM then
#   first_build_ms    duet_snapshot_build_seconds_sum (its _count must be 1)
#   eps_*             the probe Service's IPv4 EndpointSlice gets its one address changed from
#                     127.0.0.1 to 127.0.0.2 (a duet-echo pod named `new` listens there; `old` at
#                     127.0.0.1 and [::1]), written to a hidden temp file renamed over the old one.
#                     A python3 client sends GET / for the probe's host to 127.0.0.1 (a new
#                     connection each time) until pod `new` answers:
#     _serving_ms     the rename to the first answer from `new` (the file watcher's 20 ms settle,
#                     the reread of the file, the 50 ms holdoff, build, swap)
#     _read_to_serving_ms  from duet having read the change (its "Snapshot applied" line's
#                     change.age_ms before duet_snapshot_applied_timestamp_seconds) to the first
#                     answer from `new`: the goal is the holdoff (50 ms) + 5 ms
#     _build_ms       that snapshot's duet_snapshot_build_seconds
#   The IPv6 slice is unchanged: the [::1] client must still reach `old`.
# Fails (exit 1) if duet does not become ready, the probe is not served, or the change is not seen
# within CHANGE_TIMEOUT seconds.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

LAYOUTS=${LAYOUTS:-"object namespace huge"}
RUNS=${RUNS:-1}
INGRESSES=${INGRESSES:-10000}
READY_TIMEOUT=${READY_TIMEOUT:-300}
CHANGE_TIMEOUT=${CHANGE_TIMEOUT:-30}
need curl python3
DUET=$(duet_bin)
ECHO=$(echo_bin)
make_work scale-check
read -r PROBE_PORT HTTP_PORT HTTPS_PORT ADMIN_PORT < <(free_ports 4)
ADMIN="http://127.0.0.1:$ADMIN_PORT"

"$ECHO" --quiet --pod "old=127.0.0.1:$PROBE_PORT,[::1]:$PROBE_PORT" --pod "new=127.0.0.2:$PROBE_PORT" \
  --namespace team-00 --service probe >/dev/null 2>&1 &
STARTED_PIDS+=($!)
wait_200 "http://127.0.0.2:$PROBE_PORT/" 30 $!

# Prints the name of the pod that answers GET / for HOST through duet's HTTP listener at ADDR.
probe() {
  python3 - "$1" "$HTTP_PORT" "$2" <<'PY'
import http.client, json, sys
addr, port, host = sys.argv[1], int(sys.argv[2]), sys.argv[3]
conn = http.client.HTTPConnection(addr, port, timeout=5)
conn.request("GET", "/", headers={"Host": host})
resp = conn.getresponse()
body = resp.read()
print(json.loads(body)["pod"] if resp.status == 200 else f"status {resp.status}")
PY
}

# Renames a changed copy of FILE over it (OLD replaced by NEW), then asks 127.0.0.1 for HOST until
# pod `new` answers; prints the rename's and the answer's times.
change_and_wait() {
  python3 - "$@" "$HTTP_PORT" "$CHANGE_TIMEOUT" <<'PY'
import http.client, json, os, sys, time
path, old, new, host, port, timeout = sys.argv[1:]
text = open(path, encoding="utf-8").read()
if text.count(old) != 1:
    sys.exit(f"{old!r} is not in {path} exactly once")
tmp = os.path.join(os.path.dirname(path), ".scale-check.tmp")
with open(tmp, "w", encoding="utf-8") as f:
    f.write(text.replace(old, new))
written = time.time()
os.rename(tmp, path)
while True:
    conn = http.client.HTTPConnection("127.0.0.1", int(port), timeout=5)
    conn.request("GET", "/", headers={"Host": host})
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    if resp.status == 200 and json.loads(body)["pod"] == "new":
        print(f"{written:.6f} {time.time():.6f}")
        break
    if time.time() - written > float(timeout):
        sys.exit(f"pod new not serving {host} within {timeout}s")
PY
}

ms() { python3 -c "import sys; print(f'{(float(sys.argv[2]) - float(sys.argv[1])) * 1000:.{sys.argv[3]}f}')" "$1" "$2" "${3:-1}"; }
hwm_kib() { awk '/^VmHWM:/ {print $2}' "/proc/$1/status"; }

run() {
  local layout=$1 n=$2 dir=$3 log="$WORK/duet.$1.$2" p="$1 $2"
  local info="$dir/.folder.json" file old new host
  file="$dir/$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['endpointslice_file'])" "$info")"
  old=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['endpointslice_old'], end='')" "$info")
  new=${old/127.0.0.1/127.0.0.2}
  host=probe.user.example
  local start pid ready
  start=$(now)
  DUET_LOG=info "$DUET" serve --manifests "$dir" --access-log off \
    --http-listen "127.0.0.1:$HTTP_PORT" --http-listen "[::1]:$HTTP_PORT" \
    --https-listen "127.0.0.1:$HTTPS_PORT" --https-listen "[::1]:$HTTPS_PORT" \
    --admin-listen "127.0.0.1:$ADMIN_PORT" --shutdown-delay 0 >"$log.out" 2>"$log.err" &
  pid=$!
  STARTED_PIDS+=("$pid")
  ready=$(ready_time "$pid" "$ADMIN_PORT" "$READY_TIMEOUT") || die "$p: not ready: $(tail -5 "$log.err")"
  local rss cpu
  rss=$(rss_kib "$pid")
  cpu=$(cpu_seconds "$pid")
  echo "$p ready_s: $(since "$start" "$ready")"
  echo "$p cpu_ready_s: $cpu"
  echo "$p rss_ready_mib: $(mib "$rss")"
  [[ $(metric "$ADMIN/metrics" duet_snapshot_build_seconds_count) == 1 ]] ||
    die "$p: more than one snapshot was built before the first check"
  echo "$p first_build_ms: $(ms 0 "$(metric "$ADMIN/metrics" duet_snapshot_build_seconds_sum)")"
  grep -q "WARN" "$log.err" && note "$p: duet warned: $(grep -m3 'WARN' "$log.err")"
  sleep 5
  echo "$p rss_settled_mib: $(mib "$(rss_kib "$pid")")"
  echo "$p rss_peak_mib: $(mib "$(hwm_kib "$pid")")"
  [[ $(probe 127.0.0.1 "$host") == old ]] || die "$p: the probe is not served by pod old over IPv4"
  [[ $(probe ::1 "$host") == old ]] || die "$p: the probe is not served by pod old over IPv6"
  local version sum times written served line age applied
  version=$(metric "$ADMIN/metrics" duet_snapshot_version)
  sum=$(metric "$ADMIN/metrics" duet_snapshot_build_seconds_sum)
  # Put back at exit if this run fails (the folder is reused by the next run).
  cp -p "$file" "$WORK/original.$layout"
  CLEANUP_HOOKS+=("[[ ! -e '$WORK/original.$layout' ]] || mv -f '$WORK/original.$layout' '$file'")
  times=$(change_and_wait "$file" "$old" "$new" "$host") || die "$p: $times"
  read -r written served <<<"$times"
  until line=$(grep -F "snapshot.version=$((version + 1)) " "$log.err" | grep -F "Snapshot applied"); do
    sleep 0.01
  done
  applied=$(metric "$ADMIN/metrics" duet_snapshot_applied_timestamp_seconds)
  age=$(sed -n 's/.*change\.age_ms=\([0-9.e+-]*\).*/\1/p' <<<"$line")
  [[ $(probe ::1 "$host") == old ]] || die "$p: the IPv6 slice did not change, yet [::1] is not served by old"
  echo "$p eps_serving_ms: $(ms "$written" "$served")"
  [[ -n $age ]] && echo "$p eps_read_to_serving_ms: $(python3 -c "import sys; a, s, g = map(float, sys.argv[1:]); print(f'{(s - (a - g / 1000)) * 1000:.1f}')" "$applied" "$served" "$age")"
  echo "$p eps_build_ms: $(ms "$sum" "$(metric "$ADMIN/metrics" duet_snapshot_build_seconds_sum)" 3)"
  echo "$p eps_log: ${line#*INFO }"
  kill -TERM "$pid"
  wait "$pid" 2>/dev/null || true
  mv -f "$WORK/original.$layout" "$file"
}

note "duet $DUET; $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%FT%TZ)"
for layout in $LAYOUTS; do
  dir="$WORK/$layout"
  "$LOAD_DIR/user-folder.py" --out "$dir" --layout "$layout" --ingresses "$INGRESSES" \
    --probe-port "$PROBE_PORT" >&2
  for n in $(seq "$RUNS"); do
    run "$layout" "$n" "$dir"
  done
  rm -f "$WORK/original.$layout"
  rm -rf "$dir"
done
