#!/usr/bin/env bash
# scale.sh — duet on a manifest folder at scale: time to ready, memory, snapshot build times, and
# the cost of one EndpointSlice change and of one Ingress change. Loopback only; no request is
# ever routed to a pod (the pods' addresses are data: see gen-scale.py).
#
#   cargo build --profile dist -p controller --bin duet
#   benches/load/scale.sh                      # generates the 10k-Ingress size in a temp folder
#   benches/load/scale.sh /tmp/scale           # a folder made by gen-scale.py (one EndpointSlice
#                                              # and one Ingress are changed, restored at exit)
#   GEN_ARGS="--ingresses 1000 --layout service" benches/load/scale.sh
#
# Reports (one "name: value" line each):
#   ready_seconds            start of `duet serve --manifests DIR` to the first /readyz 200 (polled
#                            every 10 ms by one python3 process; READY_POLL=curl: lib.sh's
#                            wait_readyz, a curl per poll); folder_read_seconds: to its "Manifest folder read" log
#                            line (every file read and parsed, before translation)
#   cpu_ready_seconds        duet's user + system CPU time when ready (wall times follow the
#                            machine's load; this mostly does not)
#   rss_ready_mib            VmRSS when ready, and rss_settled_mib 5 s later (STARTUP_ONLY=1: stop
#                            there, no changes)
#   first_build_seconds      duet_snapshot_build_seconds_sum (its _count must be 1); first_build_log
#                            its "Snapshot applied" line (build.routes_ms, build.backends_ms,
#                            build.report_ms, build.apply_ms: where the build's time went)
#   endpointslice_*          the first Service's IPv4 slice gets one address changed (written to a
#                            hidden temp file, renamed over the old one):
#     _build_seconds         that snapshot's duet_snapshot_build_seconds (sum and count deltas)
#     _applied_seconds       the write to duet_snapshot_applied_timestamp_seconds (set in the swap)
#     _debug_routes_seconds  the write to a /debug/routes answer that shows the new address
#                            (the debug listener, --debug-listen; the request's own time included)
#     _log                   duet's "Snapshot applied" line (routes.rebuilt says whether the route
#                            table was rebuilt, build.ms what the build and apply took)
#     _live_after_change_seconds  from the change reaching the control loop (the file source's
#                            reread done) to the snapshot applied, the 50 ms holdoff included: the
#                            line's change.age_ms. _applied_seconds minus it is the file watcher's
#                            share (notify, the 20 ms settle, the reread)
#     _rss_applied_mib       VmRSS once applied, before this change's /debug/routes polling
#                            (the check before each change already asked once). Each answer
#                            serializes the whole table (28 MB at the 10k-Ingress size) and the heap
#                            keeps what that took, so rss_end_mib is mostly the bench's own asking
#   ingress_*                the same for a path added to the first Ingress
#   service_*                the same for that Ingress's Service, its port's appProtocol set to
#                            kubernetes.io/h2c (gen-scale.py's `object` layout: svc-*.yaml files)
#   The file source waits 20 ms for more events, then rereads the files the events name (the
#   rename's target; the hidden temporary file is ignored), the control loop debounces 50 ms
#   (holdoff): both are in the *_applied_seconds figures.
# Fails (exit 1) if duet does not become ready, or a change is not applied or not visible.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

READY_TIMEOUT=${READY_TIMEOUT:-300}
CHANGE_TIMEOUT=${CHANGE_TIMEOUT:-60}
need curl python3
DUET=$(duet_bin)
make_work scale
if [[ $# -ge 1 ]]; then
  DIR=$1
else
  DIR="$WORK/manifests"
  # shellcheck disable=SC2086 # GEN_ARGS is a list of flags
  "$LOAD_DIR/gen-scale.py" --out "$DIR" ${GEN_ARGS:-} >&2
fi
[[ -f $DIR/.scale.json ]] || die "$DIR has no .scale.json: make it with gen-scale.py"
info() { python3 -c "import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$DIR/.scale.json" "$1"; }

read -r HTTP_PORT HTTPS_PORT ADMIN_PORT DEBUG_PORT < <(free_ports 4)
ADMIN="http://127.0.0.1:$ADMIN_PORT"
DEBUG="http://127.0.0.1:$DEBUG_PORT"
LOG="$WORK/duet"


note "duet $DUET on $DIR: $(info ingresses) Ingresses, $(info endpointslices) EndpointSlices, $(info pods) pods ($(info layout) layout); $(nproc) cores, $(date -u +%FT%TZ)"
start=$(now)
DUET_LOG=info "$DUET" serve --manifests "$DIR" --access-log off \
  --http-listen "127.0.0.1:$HTTP_PORT" --http-listen "[::1]:$HTTP_PORT" \
  --https-listen "127.0.0.1:$HTTPS_PORT" --https-listen "[::1]:$HTTPS_PORT" \
  --admin-listen "127.0.0.1:$ADMIN_PORT" --debug-listen "127.0.0.1:$DEBUG_PORT" \
  --shutdown-delay 0 >"$LOG.out" 2>"$LOG.err" &
PID=$!
STARTED_PIDS+=("$PID")

# One python3 process polls /readyz (lib.sh's ready_time); READY_POLL=curl: a curl per poll
# (lib.sh's wait_readyz), whose process starts add to the figure.
if [[ ${READY_POLL:-} == curl ]]; then
  wait_readyz "$PID" "$ADMIN" "$start" "$READY_TIMEOUT" "$LOG.err"
  ready=$(now)
else
  ready=$(ready_time "$PID" "$ADMIN_PORT" "$READY_TIMEOUT") || die "not ready: $(tail -5 "$LOG.err")"
fi
rss_ready=$(rss_kib "$PID")
cpu_ready=$(cpu_seconds "$PID")
echo "ready_seconds: $(since "$start" "$ready")"
echo "cpu_ready_seconds: $cpu_ready"
# When duet logged that it had read (and parsed) the folder, from its own timestamp.
read_at=$(python3 -c "
import datetime, sys
for line in open(sys.argv[1]):
    if 'Manifest folder read' in line:
        stamp = line.split()[0].rstrip('Z')[:26]
        print(datetime.datetime.fromisoformat(stamp).replace(tzinfo=datetime.timezone.utc).timestamp())
        break
" "$LOG.err")
[[ -n $read_at ]] || die "no 'Manifest folder read' line in duet's log"
echo "folder_read_seconds: $(since "$start" "$read_at")"
echo "rss_ready_mib: $(mib "$rss_ready")"
[[ $(metric "$ADMIN/metrics" duet_snapshot_build_seconds_count) == 1 ]] ||
  die "more than one snapshot was built before the first check"
echo "first_build_seconds: $(metric "$ADMIN/metrics" duet_snapshot_build_seconds_sum)"
first_line=$(grep -m1 -F "Snapshot applied" "$LOG.err")
echo "first_build_log: ${first_line#*INFO }"
grep -q "diagnostic\|WARN" "$LOG.err" && note "duet warned: $(grep -m3 'WARN' "$LOG.err")"
sleep 5
echo "rss_settled_mib: $(mib "$(rss_kib "$PID")")"
if [[ -n ${STARTUP_ONLY:-} ]]; then
  exit 0
fi

# Rewrites FILE (in DIR) with OLD replaced by NEW (OLD empty: NEW appended), by rename; prints the
# time of the rename. The original comes back at exit (after duet stopped), so DIR can be reused.
rewrite() {
  python3 - "$DIR/$1" "$2" "$3" <<'PY'
import os, sys, time
path, old, new = sys.argv[1:]
text = open(path, encoding="utf-8").read()
if old:
    if old not in text:
        sys.exit(f"{old!r} is not in {path}")
    text = text.replace(old, new, 1)
else:
    text += new
tmp = os.path.join(os.path.dirname(path), ".scale-bench.tmp")
with open(tmp, "w", encoding="utf-8") as f:
    f.write(text)
os.rename(tmp, path)
print(f"{time.time():.6f}")
PY
}

# Measures one change: NAME, FILE, OLD, NEW, and a string that /debug/routes shows afterwards.
measure_change() {
  local name=$1 file=$2 old=$3 new=$4 expect=$5
  local version sum count written applied_line applied_ts shown
  version=$(metric "$ADMIN/metrics" duet_snapshot_version)
  sum=$(metric "$ADMIN/metrics" duet_snapshot_build_seconds_sum)
  count=$(metric "$ADMIN/metrics" duet_snapshot_build_seconds_count)
  curl -sf "$DEBUG/debug/routes" | grep -F -- "$expect" >/dev/null && die "/debug/routes shows $expect before the change"
  if [[ ! -e $WORK/original.$file ]]; then
    cp -p "$DIR/$file" "$WORK/original.$file"
    CLEANUP_HOOKS+=("mv -f '$WORK/original.$file' '$DIR/$file'")
  fi
  written=$(rewrite "$file" "$old" "$new") || die "cannot change $file"
  local next="snapshot.version=$((version + 1)) "
  until applied_line=$(grep -F "$next" "$LOG.err" | grep -F "Snapshot applied"); do
    within "$written" "$CHANGE_TIMEOUT" || die "$name change not applied within ${CHANGE_TIMEOUT}s"
    sleep 0.005
  done
  local rss_applied
  rss_applied=$(rss_kib "$PID")
  until curl -sf "$DEBUG/debug/routes" | grep -F -- "$expect" >/dev/null; do
    within "$written" "$CHANGE_TIMEOUT" || die "$name change not in /debug/routes within ${CHANGE_TIMEOUT}s"
  done
  shown=$(now)
  applied_ts=$(metric "$ADMIN/metrics" duet_snapshot_applied_timestamp_seconds)
  local sum2 count2
  sum2=$(metric "$ADMIN/metrics" duet_snapshot_build_seconds_sum)
  count2=$(metric "$ADMIN/metrics" duet_snapshot_build_seconds_count)
  ((count2 == count + 1)) || die "$name: $((count2 - count)) snapshots built for one change"
  echo "${name}_build_seconds: $(since "$sum" "$sum2" 6)"
  echo "${name}_applied_seconds: $(since "$written" "$applied_ts")"
  echo "${name}_debug_routes_seconds: $(since "$written" "$shown")"
  echo "${name}_rss_applied_mib: $(mib "$rss_applied")"
  local age
  age=$(sed -n 's/.*change\.age_ms=\([0-9.e+-]*\).*/\1/p' <<<"$applied_line")
  [[ -n $age ]] && echo "${name}_live_after_change_seconds: $(python3 -c "import sys; print(f'{float(sys.argv[1]) / 1000:.4f}')" "$age")"
  echo "${name}_log: ${applied_line#*INFO }"
}

address=$(info endpointslice_address)
new_address=$(info endpointslice_new_address)
measure_change endpointslice "$(info endpointslice_file)" "\"$address\"" "\"$new_address\"" "$new_address"
path=$(info ingress_new_path)
measure_change ingress "$(info ingress_file)" "" \
  "          - {path: $path, pathType: Exact, backend: {service: {name: $(info ingress_service), port: {name: http}}}}
" "\"$path\""
# The Ingress's Service gets its port's appProtocol set (HTTP/2 to the pods): a change of what the
# routes read, planned by host (routes.by_host=true in its log line).
service_file="svc-$(info ingress_file | sed 's/^ing-//')"
if [[ -e $DIR/$service_file ]]; then
  measure_change service "$service_file" \
    "targetPort: http}" "targetPort: http, appProtocol: kubernetes.io/h2c}" '"h2c"'
else
  echo "service_skipped: no $service_file in $DIR (only gen-scale.py's object layout has one)"
fi
echo "rss_end_mib: $(mib "$(rss_kib "$PID")")"
kill -0 "$PID" || die "duet exited"
