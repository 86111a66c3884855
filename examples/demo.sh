#!/usr/bin/env bash
# duet demo: builds duet and the echo backend (release, once), starts three echo "pods" on
# loopback (dual-stack 127.0.0.1:9001 + [::1]:9001, IPv4-only 127.0.0.1:9002, IPv6-only
# [::1]:9003), prints the curl lines that show family-preferring selection, then runs
# `duet serve --manifests examples/demo` on its default listeners (HTTP on 0.0.0.0:8080 and
# [::]:8080, the demo Gateway on port 8081, admin on 127.0.0.1:10254 and [::1]:10254,
# /debug/routes on 127.0.0.1:10253 and [::1]:10253) until it is stopped.
# Ctrl-C (SIGINT), SIGTERM (`kill PID`, `timeout`, a supervisor) or SIGHUP (a closed terminal)
# sent to this script alone stops duet and the pods at once, and the script exits once they are
# gone. Each is started in a process group of its own (setsid), so stopping one stops what it
# started too (cargo's compilers).
# Extra arguments go to `duet serve`, e.g. `examples/demo.sh --upstream-family RequireSameFamily`.
# DUET_DEMO_BIN=DIR runs the duet and duet-echo binaries found in DIR instead of building them.
set -euo pipefail

cd "$(dirname "$0")/.."

# The process groups this script started; stop_all ends each and waits for it.
started=()
stop_all() {
    trap - EXIT INT TERM HUP
    local pid
    for pid in "${started[@]}"; do
        kill -TERM -- "-$pid" 2>/dev/null || true
    done
    for pid in "${started[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
}
trap stop_all EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# Starts a command in a process group of its own, in the background: while the script waits for
# it with `wait`, bash runs a trap as soon as the signal arrives (for a foreground command, only
# after that command has exited).
start() {
    setsid "$@" &
    started+=("$!")
}

if [[ -n ${DUET_DEMO_BIN:-} ]]; then
    bin=$DUET_DEMO_BIN
else
    start cargo build --release -p controller -p conformance
    wait "$!"
    bin=target/release
fi

# A demo has no load balancer to take duet out of rotation first: stop without the shutdown
# delay, unless the arguments set one.
serve_args=(--manifests examples/demo)
if [[ " $* " != *" --shutdown-delay"* ]]; then
    serve_args+=(--shutdown-delay 0s)
fi

start "$bin/duet-echo" --namespace demo --service echo --ingress demo \
    --pod 'dual-stack=127.0.0.1:9001,[::1]:9001' \
    --pod 'ipv4-only=127.0.0.1:9002' \
    --pod 'ipv6-only=[::1]:9003'
echo_pid=$!

# The echo pods bind at once; give them a moment and make sure they did.
for _ in $(seq 1 50); do
    if ! kill -0 "$echo_pid" 2>/dev/null; then
        echo "demo: duet-echo failed to start (ports 9001-9003 in use?)" >&2
        exit 1
    fi
    if (exec 3<>/dev/tcp/127.0.0.1/9001) 2>/dev/null; then
        break
    fi
    sleep 0.1
done

cat <<'MSG'

==> duet demo. In another terminal:

  curl -4 -s -H 'Host: demo.local' http://127.0.0.1:8080/       # IPv4 client
  curl -6 -s -H 'Host: demo.local' 'http://[::1]:8080/'          # IPv6 client
  curl -s http://127.0.0.1:10253/debug/routes                    # the live table
  curl -s 'http://[::1]:10253/debug/routes?ingress=demo/demo'    # one Ingress's routes
  curl -6 -s -H 'Host: gw.demo.local' -H 'x-canary: 1' 'http://[::1]:8081/'   # Gateway API

Each answer is the echo JSON: "pod" says which pod served it, "family" and "local" the address
family and address it was reached over. Repeat a curl a few times: the three pods share the
requests, and the dual-stack pod answers an IPv4 client over IPv4 (127.0.0.1:9001) and an IPv6
client over IPv6 ([::1]:9001); ipv4-only and ipv6-only answer over the family they have.
To see just that:

  for i in 1 2 3 4 5 6; do curl -4 -s -H 'Host: demo.local' http://127.0.0.1:8080/ | grep -E '"(pod|family|local)"' | tr -d '\n'; echo; done
  for i in 1 2 3 4 5 6; do curl -6 -s -H 'Host: demo.local' 'http://[::1]:8080/' | grep -E '"(pod|family|local)"' | tr -d '\n'; echo; done

Edit a file under examples/demo/ and the change is live at once. Ctrl-C stops duet and the pods.

MSG

start "$bin/duet" serve "${serve_args[@]}" "$@"
wait "$!"
