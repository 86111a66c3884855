#!/usr/bin/env bash
# Builds a container image of one of duet's binaries as an OCI image archive, with no container
# daemon and no registry, so it can be built here and by users the same way:
#
#   images/build.sh duet|echo|echo-basic|pause|metallb-controller|metallb-speaker
#                   [--binary PATH] [--tag REF]... [--out FILE]
#
#   duet        target/dist/duet (built with cargo, profile dist, if missing),
#               ref duet.local/duet:dev, entrypoint /usr/local/bin/duet, cmd serve, ports 8080
#               8443 10254; the same layout as the root Dockerfile's image
#               (conformance/tests/image.rs checks both)
#   echo        target/debug/duet-echo (the conformance crate's echo backend, built if missing),
#               ref duet.local/duet-echo:dev, port 3000
#   echo-basic  conformance/gateway/bin/echo-basic (conformance/gateway/build.sh builds it), named
#               registry.k8s.io/gateway-api/echo-basic with every tag the pinned Gateway API
#               suite's manifests use (one index entry each), ports 3000 3001 8443
#   pause       conformance/node/bin/pause (conformance/node/build.sh builds it), ref
#               duet.local/pause:3.10: the test node's sandbox image
#   metallb-controller, metallb-speaker
#               conformance/node/bin/metallb-{controller,speaker} (conformance/node/build.sh
#               builds them from go.universe.tf/metallb), ref duet.local/metallb-NAME:VERSION
#               (the version conformance/node/metallb/go.mod pins); they run as root (uid 0) like
#               upstream's images (distroless/static): the speaker needs NET_RAW for ARP and NDP
#
# --tag REF (repeatable) replaces the default ref(s); --out defaults to target/images/NAME.oci.tar.
# An existing default binary is packed as it is: rebuild it first when the sources changed.
# Prints the archive's path on its last line; `ctr -n k8s.io images import FILE` or
# `kind load image-archive FILE` loads it under its ref.
#
# The image holds one layer: the binary at /usr/local/bin/NAME with its debug info stripped
# (objcopy --strip-debug, binutils), every shared library `ldd` lists for it, copied from this
# machine's Debian packages (a Rust binary: libc6 for libc.so.6, libm.so.6 and the loader
# /lib64/ld-linux-x86-64.so.2, libgcc-s1 for libgcc_s.so.1; the package of each is printed),
# /etc/ssl/certs/ca-certificates.crt (Debian's ca-certificates), the copyright file of each of
# these packages under /usr/share/doc, /etc/passwd and /etc/group with root and nonroot (65532,
# home /home/nonroot owned by it), /etc/nsswitch.conf, and /tmp (1777).
# It runs as 65532:65532 (MetalLB's as 0:0). images/oci.py packs it deterministically: the same
# binary and libraries give the same digest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
readonly root

die() {
  echo "images/build.sh: $*" >&2
  exit 1
}

usage() {
  sed -n '5,27p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit "${1:-2}"
}

# Sets what differs between the images: name, default_binary, default_refs, cmd, ports, labels.
select_image() {
  local version
  version=$(package_field version)
  source_label="org.opencontainers.image.source=$(package_field repository)"
  cmd=()
  user=65532:65532
  case $kind in
  duet)
    name=duet
    default_binary=$root/target/dist/duet
    default_refs=(duet.local/duet:dev)
    cmd=(serve)
    ports=(8080/tcp 8443/tcp 10254/tcp)
    ;;
  echo)
    name=duet-echo
    default_binary=$root/target/debug/duet-echo
    default_refs=(duet.local/duet-echo:dev)
    ports=(3000/tcp)
    ;;
  echo-basic)
    name=echo-basic
    default_binary=$root/conformance/gateway/bin/echo-basic
    default_refs=()
    ports=(3000/tcp 3001/tcp 8443/tcp)
    source_label="org.opencontainers.image.source=https://github.com/kubernetes-sigs/gateway-api"
    version=$(suite_version)
    ;;
  pause)
    name=pause
    default_binary=$root/conformance/node/bin/pause
    default_refs=(duet.local/pause:3.10)
    ports=()
    source_label="org.opencontainers.image.source=https://github.com/kubernetes/kubernetes"
    version=3.10
    ;;
  metallb-controller | metallb-speaker)
    name=$kind
    default_binary=$root/conformance/node/bin/$kind
    version=$(metallb_version)
    default_refs=("duet.local/$kind:$version")
    ports=()
    source_label="org.opencontainers.image.source=https://github.com/metallb/metallb"
    user=0:0
    ;;
  *) usage ;;
  esac
  version_label="org.opencontainers.image.version=$version"
}

# A field of the controller crate's package (version, repository), the workspace's when the crate
# inherits it.
package_field() {
  python3 - "$root" "$1" <<'EOF'
import sys, tomllib
root, field = sys.argv[1:]
value = tomllib.load(open(f"{root}/controller/Cargo.toml", "rb"))["package"].get(field, {"workspace": True})
if isinstance(value, dict):
    value = tomllib.load(open(f"{root}/Cargo.toml", "rb"))["workspace"]["package"][field]
print(value)
EOF
}

# The go.universe.tf/metallb version conformance/node/metallb/go.mod pins (v0.15.2).
metallb_version() {
  awk '$1 == "go.universe.tf/metallb" { print $2 }' "$root/conformance/node/metallb/go.mod"
}

# The folder of the pinned sigs.k8s.io/gateway-api/conformance module (conformance/gateway/go.mod).
suite_dir() {
  command -v go >/dev/null 2>&1 || die "go not found: the echo-basic refs come from the Gateway API suite module (or give --tag)"
  (cd "$root/conformance/gateway" && go list -mod=readonly -m -f '{{.Dir}}' sigs.k8s.io/gateway-api/conformance)
}

suite_version() {
  if [[ -f $root/conformance/gateway/bin/echo-basic.version ]]; then
    cat "$root/conformance/gateway/bin/echo-basic.version"
  else
    (cd "$root/conformance/gateway" && go list -mod=readonly -m -f '{{.Version}}' sigs.k8s.io/gateway-api/conformance)
  fi
}

# Every registry.k8s.io/gateway-api/echo-basic:TAG the suite's manifests name, sorted.
suite_echo_refs() {
  local dir
  dir=$(suite_dir)
  [[ -d $dir/base ]] || die "the suite module is not downloaded: run conformance/gateway/build.sh"
  grep -rhoE 'registry\.k8s\.io/gateway-api/echo-basic:[A-Za-z0-9._-]+' "$dir/base" "$dir/tests" | sort -u
}

# Builds the default binary when it is missing.
ensure_binary() {
  if [[ -n $binary ]]; then
    [[ -f $binary ]] || die "--binary $binary: no such file"
    return
  fi
  binary=$default_binary
  [[ -f $binary ]] && return
  echo "images/build.sh: $binary is missing, building it" >&2
  case $kind in
  duet) (cd "$root" && cargo build --profile dist --locked -p controller --bin duet) ;;
  echo) (cd "$root" && cargo build --locked -p conformance --bin duet-echo) ;;
  echo-basic) "$root/conformance/gateway/build.sh" >/dev/null ;;
  pause | metallb-controller | metallb-speaker) "$root/conformance/node/build.sh" >/dev/null ;;
  esac
  [[ -f $binary ]] || die "$binary was not built"
}

require_tools() {
  command -v objcopy >/dev/null 2>&1 || die "objcopy not found (apt-get install binutils)"
  command -v ldd >/dev/null 2>&1 || die "ldd not found (apt-get install libc-bin)"
  command -v python3 >/dev/null 2>&1 || die "python3 not found"
  [[ -f /etc/ssl/certs/ca-certificates.crt ]] ||
    die "/etc/ssl/certs/ca-certificates.crt not found (apt-get install ca-certificates)"
}

# The files `ldd` lists for the binary: each library as ldd resolves it and the loader at the
# path the binary asks for. None for a static binary.
libraries() {
  local out
  out=$(ldd "$1" 2>&1) || true
  if grep -q 'not a dynamic executable\|statically linked' <<<"$out"; then
    return
  fi
  awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' <<<"$out"
}

# The Debian package a file comes from, or nothing.
package_of() {
  if command -v dpkg >/dev/null 2>&1; then
    dpkg -S "$1" 2>/dev/null | head -n1 | cut -d: -f1 || true
  fi
}

# Copies a file of this machine into the rootfs at the same path, with its package's copyright
# file, and says which package (and version) it came from.
stage_from_host() {
  local rootfs=$1 file=$2 owner=${3:-$2} pkg
  mkdir -p "$rootfs$(dirname "$file")"
  cp -L "$file" "$rootfs$file"
  pkg=$(package_of "$owner")
  if [[ -z $pkg ]]; then
    echo "images/build.sh:   $file (not from a Debian package)" >&2
    return
  fi
  echo "images/build.sh:   $file ($pkg $(dpkg-query -W -f '${Version}' "$pkg"))" >&2
  if [[ -f /usr/share/doc/$pkg/copyright ]]; then
    mkdir -p "$rootfs/usr/share/doc/$pkg"
    cp -L "/usr/share/doc/$pkg/copyright" "$rootfs/usr/share/doc/$pkg/"
  fi
}

# The binary (debug info stripped) and every library ldd lists for it, all listed in executables.
stage_binary() {
  local rootfs=$1 lib
  mkdir -p "$rootfs/usr/local/bin"
  objcopy --strip-debug "$binary" "$rootfs/usr/local/bin/$name"
  executables=("$rootfs/usr/local/bin/$name")
  while read -r lib; do
    stage_from_host "$rootfs" "$lib"
    executables+=("$rootfs$lib")
  done < <(libraries "$binary")
}

# CA bundle (generated by ca-certificates' update-ca-certificates), users, groups, name service.
stage_etc() {
  local rootfs=$1
  stage_from_host "$rootfs" /etc/ssl/certs/ca-certificates.crt /usr/sbin/update-ca-certificates
  printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' \
    'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >"$rootfs/etc/passwd"
  printf '%s\n' 'root:x:0:' 'nonroot:x:65532:' >"$rootfs/etc/group"
  printf '%s\n' 'passwd: files' 'group: files' 'hosts: files dns' >"$rootfs/etc/nsswitch.conf"
}

# The rootfs with fixed modes: folders 0755, /tmp 1777, binary and libraries 0755, the rest 0644.
stage_files() {
  local rootfs=$1
  mkdir -p "$rootfs"/{home/nonroot,tmp}
  stage_binary "$rootfs"
  stage_etc "$rootfs"
  find "$rootfs" -type d -exec chmod 0755 {} +
  find "$rootfs" -type f -exec chmod 0644 {} +
  chmod 0755 "${executables[@]}"
  chmod 1777 "$rootfs/tmp"
}

pack() {
  local rootfs=$1 ref port c
  local args=(--out "$out" --owner home/nonroot=65532:65532 --user "$user"
    "--entrypoint=/usr/local/bin/$name" --workdir / --created-by "images/build.sh $kind"
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
    --label "$source_label" --label "$version_label")
  for ref in "${refs[@]}"; do args+=(--ref "$ref"); done
  for port in "${ports[@]}"; do args+=(--port "$port"); done
  for c in "${cmd[@]}"; do args+=("--cmd=$c"); done
  python3 "$root/images/oci.py" pack "$rootfs" "${args[@]}"
}

main() {
  [[ $# -ge 1 ]] || usage
  kind=$1
  shift
  if [[ $kind == -h || $kind == --help ]]; then usage 0; fi
  binary="" out="" refs=()
  while [[ $# -gt 0 ]]; do
    case $1 in
    --binary) binary=${2:?--binary needs a path} ;;
    --tag) refs+=("${2:?--tag needs a ref}") ;;
    --out) out=${2:?--out needs a path} ;;
    -h | --help) usage 0 ;;
    *) usage ;;
    esac
    shift 2
  done
  select_image
  require_tools
  ensure_binary
  if [[ ${#refs[@]} -eq 0 && $kind == echo-basic ]]; then
    mapfile -t refs < <(suite_echo_refs)
    [[ ${#refs[@]} -gt 0 ]] || die "the suite's manifests name no echo-basic image"
  elif [[ ${#refs[@]} -eq 0 ]]; then
    refs=("${default_refs[@]}")
  fi
  out=${out:-$root/target/images/$name.oci.tar}
  mkdir -p "$(dirname "$out")"
  local start
  start=$(date +%s)
  rootfs=$(mktemp -d)
  trap 'rm -rf "$rootfs"' EXIT
  echo "images/build.sh: $name from $binary as ${refs[*]}" >&2
  stage_files "$rootfs"
  pack "$rootfs"
  echo "images/build.sh: built in $(($(date +%s) - start)) s, $(du -h "$out" | cut -f1)" >&2
  echo "$out"
}

main "$@"
