#!/usr/bin/env bash
# Every test of duet (the README's test command): installs what a fresh Debian machine lacks
# (as root), builds the book and checks its links and README.md's, builds or reuses the real
# Kubernetes control plane, then runs the workspace tests,
# a few seconds of fuzzing per target, the Ingress conformance suite on the real control plane
# over both families, the upstream Gateway API conformance suite on an IPv4-primary and an
# IPv6-primary cluster, and the Helm chart tests. Exits non-zero on the first failure.
# `.ci/run` runs it after fmt and clippy.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

# Debian packages the tests need, installed once per machine: apt-get update at most once per run.
apt_updated=
apt_install() {
  if [[ -z $apt_updated ]]; then
    apt-get update -qq
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# promtool and a Prometheus server for the metric tests (controller/tests/e2e_metrics.rs). The
# package's postinst may try to start its service; that is harmless (the tests use their own ports).
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
  echo "== apt-get install prometheus"
  apt_install prometheus
fi

# setpriv (util-linux, essential on Debian) gives the conformance runner's duet a parent-death
# signal (conformance/tests/runner_cleanup.rs).
if ! command -v setpriv >/dev/null 2>&1; then
  echo "== apt-get install util-linux"
  apt_install util-linux
fi

# iproute2 (`ip`) sets up the real test cluster's network namespace (conformance/src/cluster).
if ! command -v ip >/dev/null 2>&1; then
  echo "== apt-get install iproute2"
  apt_install iproute2
fi

# nft (nftables) lets the test cluster's stand-in load balancer forward LoadBalancer addresses
# to endpoints (conformance/src/cluster/loadbalancer.rs; controller/tests/kube_gateway.rs).
if ! command -v nft >/dev/null 2>&1; then
  echo "== apt-get install nftables"
  apt_install nftables
fi

# objcopy (binutils) strips the binaries and Debian's CA bundle (ca-certificates) goes into the
# container images images/build.sh makes (conformance/tests/image.rs).
if ! command -v objcopy >/dev/null 2>&1 || [[ ! -f /etc/ssl/certs/ca-certificates.crt ]]; then
  echo "== apt-get install binutils ca-certificates"
  apt_install binutils ca-certificates
fi

# The book (docs/, mdBook) and README.md: build the book and check every internal link and anchor
# of both (docs/check-links.py, Python stdlib). mdBook comes from crates.io, pinned, built with only
# the `search` feature (the search index; no `serve`/`watch`), into ~/.cargo/bin: about 4.5 min on
# a fresh machine (2 CPU-minutes), skipped when that version is there; the build takes 0.3 s.
MDBOOK_VERSION=0.5.4
mdbook="${CARGO_HOME:-$HOME/.cargo}/bin/mdbook"
if [[ "$("$mdbook" --version 2>/dev/null)" != "mdbook v$MDBOOK_VERSION" ]]; then
  echo "== cargo install mdbook $MDBOOK_VERSION"
  cargo install mdbook --version "$MDBOOK_VERSION" --locked --no-default-features --features search --quiet
fi
if ! command -v python3 >/dev/null 2>&1; then
  echo "== apt-get install python3"
  apt_install python3
fi
echo "== the book: mdbook build docs, docs/check-links.py"
python3 docs/test_check_links.py
"$mdbook" build docs
python3 docs/check-links.py docs/book README.md

# Go also builds h2spec for the HTTP/2 conformance test (controller/tests/e2e_h2spec.rs calls
# conformance/tools/h2spec/build.sh itself).
# The real control plane (kube-apiserver, kube-controller-manager v1.37.2, etcd v3.7.0) built
# from the Go modules of conformance/cluster/go.mod, or reused when its inputs did not change
# (docs/src/contributing/control-plane.md). Go itself comes with these machines; without it this fails.
echo "== control plane (conformance/cluster/build.sh)"
if ! command -v go >/dev/null 2>&1; then
  echo "go is missing: the real control plane is built from Go modules (Go >= 1.26)" >&2
  exit 1
fi
conformance/cluster/build.sh

# The real node (kubelet, kube-proxy, kube-scheduler, containerd, runc, the CNI plugins, pause)
# from the Go modules of conformance/cluster/go.mod and conformance/node/go.mod, or reused when its
# inputs did not change (docs/src/contributing/control-plane.md). runc links libseccomp (cgo); pause is a static C
# program (gcc, libc6-dev's libc.a); crictl and ctr look at the node.
if ! dpkg -s libseccomp-dev pkg-config libc6-dev >/dev/null 2>&1; then
  echo "== apt-get install libseccomp-dev pkg-config libc6-dev"
  apt_install libseccomp-dev pkg-config libc6-dev
fi
echo "== real node (conformance/node/build.sh)"
conformance/node/build.sh

# The Gateway API suite's test binary, its CRD installer and the real echo-basic
# (docs/src/contributing/conformance.md), from the modules of conformance/gateway/go.mod through the Go module proxy,
# or reused when their inputs did not change. conformance/tests/echo_basic_pods.rs needs them.
echo "== Gateway API suite and echo-basic (conformance/gateway/build.sh)"
conformance/gateway/build.sh

# aioquic, the independent HTTP/3 client of controller/tests/e2e_http3.rs, in target/h3client-venv
# (the tests also make it on demand; made here so that a fresh machine never lacks it).
echo "== HTTP/3 test client (conformance/h3client/setup.sh)"
conformance/h3client/setup.sh >/dev/null

echo "== workspace tests (cargo test --workspace --locked)"
cargo test --workspace --locked

echo "== fuzzing every target in fuzz/, 4 s each (docs/src/contributing/fuzzing.md)"
# cargo-fuzz passes nightly flags to rustc; RUSTC_BOOTSTRAP=1 lets the stable toolchain take them.
# About 1.5 min to install cargo-fuzz on a fresh machine, 3 CPU-minutes to build the targets (9
# min on 2 cores shared with other builds), 4 s to run each.
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked --quiet
fi
cargo fmt --manifest-path fuzz/Cargo.toml --check
fuzz_log=$(mktemp)
RUSTC_BOOTSTRAP=1 cargo fuzz build --dev
for target in $(cargo fuzz list); do
  mkdir -p "fuzz/corpus/$target"
  if ! RUSTC_BOOTSTRAP=1 cargo fuzz run --dev "$target" "fuzz/corpus/$target" \
    "fuzz/seeds/$target" -- -max_total_time=4 >"$fuzz_log" 2>&1; then
    tail -n 60 "$fuzz_log"
    exit 1
  fi
  done_line=$(grep -E '^Done [0-9]+ runs' "$fuzz_log")
  echo "$target: $done_line"
done
rm -f "$fuzz_log"

echo "== Ingress conformance on the real control plane and a real node, IPv4 and IPv6 (docs/src/contributing/conformance.md)"
cargo build --locked -q -p controller --bin duet -p conformance --bin duet-conformance --bin duet-echo
target/debug/duet-conformance ../shared/conformance/upstream-ingress/features --family both --real-node

# duet's own features name each pod's families (an IPv6-only pod beside a dual-stack one): the
# stand-in kubelet gives a pod the families it asks for, a CNI bridge gives every pod both.
echo "== duet's family features on the real control plane with the stand-in kubelet, IPv4 and IPv6"
target/debug/duet-conformance conformance/features --family both

echo "== Ingress conformance with ingress-nginx's class settings (--ingress-class nginx --controller-name k8s.io/ingress-nginx)"
target/debug/duet-conformance ../shared/conformance/upstream-ingress/features conformance/features --family both \
  --ingress-class nginx --controller-name k8s.io/ingress-nginx

# duet as users run it, on a real node: its image and the echo image built by images/build.sh,
# `helm install` with Helm's own CLI (conformance/helm/build.sh), then under continuous load from
# clients of both families through the LoadBalancer: helm upgrade, a backend roll, the leader's
# pod deleted, kill -9 of a duet container (failures counted, not failing), kube-apiserver,
# containerd and kubelet restarted. One line per scenario, then `N passed, N failed`
# (docs/src/contributing/control-plane.md).
echo "== node scenarios on a real node, clients of both families (docs/src/contributing/control-plane.md)"
conformance/helm/build.sh >/dev/null
target/debug/duet-conformance node-scenarios --family both

# The upstream Gateway API conformance suite v1.6.3, unmodified, every profile duet claims (core
# and the extended features of conformance/gateway/options.go), on the standard and on the
# experimental channel's CRDs, each on a dual-stack cluster with IPv4 primary and on one with IPv6
# primary, with a real node running the suite's pods as containers of the images its manifests
# name (built by images/build.sh, imported into containerd). It prints per run the node, then
# `GATEWAY-HTTP core: N passed, N failed, N skipped` (and extended, and the other profiles) and
# the extended features not claimed; the reports are in target/gateway-conformance/
# (conformance/reports/ holds the committed ones). A run that cannot happen (no cluster, no
# report) fails the build, and so does any failed test, core or extended.
echo "== Gateway API conformance on a real node, both channels, IPv4 and IPv6 primary (docs/src/contributing/conformance.md)"
target/debug/duet-conformance gateway --real-node --family both --channel both \
  --report-dir target/gateway-conformance

echo "== Helm chart tests (charts/tests/run.sh)"
charts/tests/run.sh
