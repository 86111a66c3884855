#!/usr/bin/env bash
# scale-kube.sh — scale.sh's figures in Kubernetes mode: the gen-scale.py objects are created in
# a real control plane (duet-cluster: etcd, kube-apiserver, kube-controller-manager in a network
# namespace of their own), then `duet serve --kubeconfig` runs in that namespace. Loopback of
# that namespace only; no request is routed to a pod (the pods' addresses are data).
#
#   cargo build --profile dist -p controller --bin duet && cargo build -p conformance --bin duet-cluster
#   conformance/cluster/build.sh                 # the control plane's binaries
#   benches/load/scale-kube.sh                   # the 10k-Ingress size
#   GEN_ARGS="--ingresses 1000" benches/load/scale-kube.sh
#   benches/load/scale-kube.sh /tmp/scale        # a folder made by gen-scale.py --addresses benchmark
#   DUET_BINS="/tmp/before target/dist/duet /tmp/before target/dist/duet" \
#     benches/load/scale-kube.sh                 # one load, each binary in turn (interleaved)
#   target/debug/duet-cluster up --dir /tmp/c &  # a cluster kept between runs: the objects are
#   CLUSTER_DIR=/tmp/c benches/load/scale-kube.sh /tmp/scale   # loaded by the first run only
#
# The load (kube-load.py, 8 connections, JSON bodies when PyYAML is installed) is paid once per
# cluster: DUET_BINS (default: DUET_BIN, else target/dist/duet) are run one after the other on
# the same objects, each stopped before the next starts; with CLUSTER_DIR the cluster that
# `duet-cluster up --dir DIR` runs is used (and left running), and a stamp in DIR (the folder's
# .scale.json digest) says its objects were loaded by an earlier run.
#
# Reports (one "name: value" line each):
#   load_seconds             creating every object through the API (not printed when CLUSTER_DIR's
#                            cluster was loaded by an earlier run)
#   then for each binary of DUET_BINS, after a "run: N BINARY" line:
#   ready_seconds            start of duet to the first /readyz 200 (lists of every kind, the
#                            first snapshot built and live; polled every 10 ms by one python3)
#   cpu_ready_seconds        duet's user + system CPU time when ready
#   control_plane_cpu_seconds  what etcd, kube-apiserver and kube-controller-manager spent in the
#                            same time (mostly answering duet's lists and watches): the CPU the
#                            2 cores had left for duet's start
#   rss_ready_mib            VmRSS when ready, and rss_settled_mib 5 s later
#   first_build_seconds      duet_snapshot_build_seconds_sum of the first snapshot; first_build_log
#                            its "Snapshot applied" line (the build's phases, as in scale.sh)
#   endpointslice_*          one address of the first Service's IPv4 slice is replaced (a JSON
#                            patch through the API; the next run swaps it back): _build_seconds
#                            is that snapshot's build time, _applied_seconds from the API
#                            server's answer to the swap (duet_snapshot_applied_timestamp_seconds):
#                            the watch's delivery and the 50 ms holdoff are in it; _log its
#                            "Snapshot applied" line
#   service_*                the same for that Service: its port's appProtocol set to
#                            kubernetes.io/h2c (the next run removes it), a change of what its
#                            routes read (routes.by_host=true in the log: only the Ingresses
#                            reading it are planned again)
#   rss_end_mib              VmRSS after the changes
# Fails (exit 1) if the cluster or a duet does not become ready, or a change is not applied.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

READY_TIMEOUT=${READY_TIMEOUT:-600}
CHANGE_TIMEOUT=${CHANGE_TIMEOUT:-60}
need curl python3 nsenter sha256sum
read -r -a BINS <<<"${DUET_BINS:-$(duet_bin)}"
((${#BINS[@]} > 0)) || die "DUET_BINS is empty"
for bin in "${BINS[@]}"; do
  [[ -x $bin ]] || die "no duet binary at $bin (DUET_BINS)"
done
make_work scale-kube
if [[ $# -ge 1 ]]; then
  DIR=$1
else
  DIR="$WORK/manifests"
  # shellcheck disable=SC2086 # GEN_ARGS is a list of flags
  "$LOAD_DIR/gen-scale.py" --out "$DIR" --addresses benchmark ${GEN_ARGS:-} >&2
fi
[[ -f $DIR/.scale.json ]] || die "$DIR has no .scale.json: make it with gen-scale.py"
info() { python3 -c "import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$DIR/.scale.json" "$1"; }

# The control plane, in its own network namespace: started here, or CLUSTER_DIR's.
if [[ -n ${CLUSTER_DIR:-} ]]; then
  CDIR=$CLUSTER_DIR
  [[ -f $CDIR/ready && -f $CDIR/netns ]] ||
    die "no cluster is ready in $CDIR: start one with 'duet-cluster up --dir $CDIR'"
else
  CLUSTER_BIN=${CLUSTER_BIN:-$REPO_ROOT/target/debug/duet-cluster}
  [[ -x $CLUSTER_BIN ]] || die "no duet-cluster at $CLUSTER_BIN: run 'cargo build -p conformance --bin duet-cluster' (or set CLUSTER_BIN)"
  CDIR="$WORK/cluster"
  "$CLUSTER_BIN" up --dir "$CDIR" >"$WORK/cluster.log" 2>&1 &
  STARTED_PIDS+=("$!")
  start=$(now)
  until grep -qx ready "$WORK/cluster.log"; do
    within "$start" 180 || die "the cluster did not start: $(tail -5 "$WORK/cluster.log")"
    sleep 0.2
  done
fi
NETNS=$(cat "$CDIR/netns")
# etcd, kube-apiserver and kube-controller-manager: their command lines name the cluster's folder.
mapfile -t CONTROL_PLANE < <(pgrep -f -- "--.*$CDIR/" || true)
((${#CONTROL_PLANE[@]} > 0)) || die "no control plane process names $CDIR"
# Every curl of this script and of lib.sh's helpers runs in the cluster's namespace.
curl() { nsenter --net="$NETNS" curl "$@"; }
KUBECONFIG_FILE="$CDIR/kubeconfig"

note "Kubernetes mode on $DIR: $(info ingresses) Ingresses, $(info endpointslices) EndpointSlices, $(info pods) pods; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ)"
STAMP="$CDIR/scale-kube.loaded"
digest=$(sha256sum "$DIR/.scale.json" | cut -d' ' -f1)
if [[ -f $STAMP && $(cat "$STAMP") == "$digest" ]]; then
  note "the objects were loaded into $CDIR by an earlier run"
else
  loaded=$(now)
  nsenter --net="$NETNS" python3 "$LOAD_DIR/kube-load.py" --kubeconfig "$KUBECONFIG_FILE" "$DIR" >&2
  echo "load_seconds: $(since "$loaded" "$(now)" 1)"
  echo "$digest" >"$STAMP"
fi

ADMIN_PORT=9901
ADMIN="http://127.0.0.1:$ADMIN_PORT"
slice_file="$DIR/$(info endpointslice_file)"
read -r slice service < <(python3 -c "
import re, sys
text = open(sys.argv[1]).read()
name = re.search(r'^  name: (\S+)', text, re.M).group(1)
ns = re.search(r'^  namespace: (\S+)', text, re.M).group(1)
owner = re.search(r'kubernetes.io/service-name: ([^,}\s]+)', text).group(1)
print(f'{ns}/{name} {ns}/{owner}')" "$slice_file")

# One change through the API (COMMAND prints when the API server answered): the build seconds
# of the snapshot it made, when that was live after the answer, and its "Snapshot applied" line.
measure_change() {
  local name=$1 pid=$2 log=$3 sum count applied_before answered sum2 count2 line
  shift 3
  sum=$(metric "$ADMIN/metrics" duet_snapshot_build_seconds_sum)
  count=$(metric "$ADMIN/metrics" duet_snapshot_build_seconds_count)
  applied_before=$(metric "$ADMIN/metrics" duet_snapshot_applied_timestamp_seconds)
  answered=$("$@")
  until [[ $(metric "$ADMIN/metrics" duet_snapshot_applied_timestamp_seconds) != "$applied_before" ]]; do
    within "$answered" "$CHANGE_TIMEOUT" || die "the $name change was not applied within ${CHANGE_TIMEOUT}s"
    kill -0 "$pid" || die "duet exited"
    sleep 0.005
  done
  sleep 0.2 # a second snapshot for the same change would show in the count
  sum2=$(metric "$ADMIN/metrics" duet_snapshot_build_seconds_sum)
  count2=$(metric "$ADMIN/metrics" duet_snapshot_build_seconds_count)
  ((count2 == count + 1)) || note "$((count2 - count)) snapshots were built for one $name change"
  echo "${name}_build_seconds: $(since "$sum" "$sum2" 6)"
  echo "${name}_applied_seconds: $(since "$answered" "$(metric "$ADMIN/metrics" duet_snapshot_applied_timestamp_seconds)")"
  line=$(grep -F "Snapshot applied" "$log" | tail -1)
  echo "${name}_log: ${line#*INFO }"
}

# One duet run: ready, RSS, the first build, then one endpoint address and one Service port's
# protocol changed through the API.
measure() {
  local run=$1 duet=$2 log="$WORK/duet.$1" start ready rss_ready pid
  echo "run: $run $duet"
  note "run $run: $duet, load $(cut -d' ' -f1-3 /proc/loadavg)"
  cp_start=$(cpu_seconds "${CONTROL_PLANE[@]}")
  start=$(now)
  # nsenter execs duet: the pid is duet's.
  DUET_LOG=info nsenter --net="$NETNS" "$duet" serve --kubeconfig "$KUBECONFIG_FILE" --access-log off \
    --http-listen 127.0.0.1:8080 --http-listen "[::1]:8080" \
    --https-listen 127.0.0.1:8443 --https-listen "[::1]:8443" \
    --admin-listen "127.0.0.1:$ADMIN_PORT" --shutdown-delay 0 >"$log.out" 2>"$log.err" &
  pid=$!
  STARTED_PIDS=("$pid" "${STARTED_PIDS[@]}")
  ready=$(ready_time "$pid" "$ADMIN_PORT" "$READY_TIMEOUT" nsenter --net="$NETNS") ||
    die "not ready: $(tail -5 "$log.err")"
  rss_ready=$(rss_kib "$pid")
  cp_ready=$(cpu_seconds "${CONTROL_PLANE[@]}")
  echo "ready_seconds: $(since "$start" "$ready")"
  echo "cpu_ready_seconds: $(cpu_seconds "$pid")"
  echo "control_plane_cpu_seconds: $(since "$cp_start" "$cp_ready" 2)"
  echo "rss_ready_mib: $(mib "$rss_ready")"
  echo "first_build_seconds: $(metric "$ADMIN/metrics" duet_snapshot_build_seconds_sum)"
  first_line=$(grep -m1 -F "Snapshot applied" "$log.err")
  echo "first_build_log: ${first_line#*INFO }"
  sleep 5
  echo "rss_settled_mib: $(mib "$(rss_kib "$pid")")"

  measure_change endpointslice "$pid" "$log.err" nsenter --net="$NETNS" python3 "$LOAD_DIR/kube-load.py" \
    --kubeconfig "$KUBECONFIG_FILE" --patch-slice "$slice" \
    --address "$(info endpointslice_address)=$(info endpointslice_new_address)"
  measure_change service "$pid" "$log.err" nsenter --net="$NETNS" python3 "$LOAD_DIR/kube-load.py" \
    --kubeconfig "$KUBECONFIG_FILE" --patch-service "$service"
  echo "rss_end_mib: $(mib "$(rss_kib "$pid")")"
  kill -0 "$pid" || die "duet exited"
  kill -TERM "$pid"
  wait "$pid" 2>/dev/null || true
  STARTED_PIDS=("${STARTED_PIDS[@]:1}")
}

run=0
for bin in "${BINS[@]}"; do
  run=$((run + 1))
  measure "$run" "$bin"
done
