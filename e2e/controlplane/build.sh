#!/usr/bin/env bash
# Builds the pinned control-plane binaries (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, etcd, kwok) from Go modules into a cache directory
# outside the repository, keyed by the pinned versions; with --nodes, the real
# nodes' kubelet and kube-proxy as well (e2e/nodes/build.sh). Prints the binary
# directory on its last line of stdout. Does nothing for binaries already built.
#
#   build.sh [--nodes]
set -euo pipefail

with_nodes=0
case "${1:-}" in
  "") ;;
  --nodes) with_nodes=1 ;;
  *) echo "usage: build.sh [--nodes]" >&2; exit 2 ;;
esac

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"

# The key changes whenever a pinned version changes (go.mod / go.sum / this script).
key=$(cat go.mod go.sum build.sh | sha256sum | cut -c1-16)
k8s_version=$(awk '$1=="k8s.io/kubernetes"{print $2}' go.mod)
etcd_version=$(awk '$1=="go.etcd.io/etcd/server/v3"{print $2}' go.mod)
kwok_version=$(awk '$1=="sigs.k8s.io/kwok"{print $2}' go.mod)
cache_root=${NODEWARDEN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodewarden}
bin_dir="$cache_root/controlplane/${k8s_version}-etcd${etcd_version}-kwok${kwok_version}-${key}"
mkdir -p "$bin_dir"

# Never download a Go toolchain: the pinned modules need the local Go >= 1.26.
export GOTOOLCHAIN=local
export GOFLAGS="-mod=readonly -buildvcs=false"
export CGO_ENABLED=0
# The compiler collects garbage four times less often: measured on a cold build
# of client-go and the apiserver library, 180 s instead of 247 s; memory is
# plentiful next to time here (the largest link stays under a few GiB).
export GOGC=${GOGC:-400}

go_minor=$(go env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/')
if [ "${go_minor:-0}" -lt 26 ]; then
  echo "controlplane: Go >= 1.26 is required (found $(go env GOVERSION))" >&2
  exit 1
fi

k8s_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=${k8s_version}"
k8s_ldflags+=" -X k8s.io/component-base/version.gitMajor=1"
k8s_ldflags+=" -X k8s.io/component-base/version.gitMinor=$(echo "$k8s_version" | cut -d. -f2)"
k8s_ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"

# The Kubernetes binaries come from one `go build`: the packages they share
# (most of them) are compiled once, and the links run side by side.
k8s_binaries=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
[ "$with_nodes" -eq 0 ] || k8s_binaries+=(kubelet kube-proxy)
# name | package | module | ldflags, for the binaries of other modules
others=(
  "etcd|go.etcd.io/etcd/server/v3|go.etcd.io/etcd/server/v3@${etcd_version}|-s -w"
  "kwok|sigs.k8s.io/kwok/cmd/kwok|sigs.k8s.io/kwok@${kwok_version}|-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${kwok_version}"
)

# kwok simulates nodes and pods through "stages": kwokctl's defaults (fast node
# start, node heartbeat with lease, fast pods) plus nodewarden's own in
# stages/*.yaml. The module's files below are taken from the pinned kwok module;
# stages/ holds copies of its node-initialize, node-heartbeat-with-lease and
# pod-complete (each narrowed by a selector line, see their headers) and the
# stages that simulate failing or hanging Jobs and Node reboots.
kwok_stages="kustomize/stage/pod/fast/pod-ready.yaml
kustomize/stage/pod/fast/pod-delete.yaml"

# Written on every run (it is cheap), so that editing stages/ takes effect
# without a rebuild; replaced only when its content changed.
write_kwok_stages() {
  local dir f tmp
  dir=$(go mod download -json "sigs.k8s.io/kwok@${kwok_version}" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  [ -n "$dir" ] || { echo "controlplane: cannot locate module sigs.k8s.io/kwok@${kwok_version}" >&2; return 1; }
  tmp=$(mktemp "$bin_dir/.kwok-stages.yaml.XXXXXX")
  {
    for f in $kwok_stages; do
      echo "---"
      echo "# sigs.k8s.io/kwok@${kwok_version} $f"
      cat "$dir/$f"
    done
    for f in "$here"/stages/*.yaml; do
      echo "---"
      echo "# e2e/controlplane/stages/${f##*/}"
      cat "$f"
    done
  } >"$tmp" || { rm -f "$tmp"; return 1; }
  if cmp -s "$tmp" "$bin_dir/kwok-stages.yaml"; then
    rm -f "$tmp"
  else
    chmod 644 "$tmp"
    mv "$tmp" "$bin_dir/kwok-stages.yaml"
    echo "controlplane: wrote $bin_dir/kwok-stages.yaml" >&2
  fi
}

missing=()
for name in "${k8s_binaries[@]}" etcd kwok; do
  [ -x "$bin_dir/$name" ] || missing+=("$name")
done
if [ ${#missing[@]} -eq 0 ]; then
  write_kwok_stages || exit 1
  echo "controlplane: all binaries present in $bin_dir" >&2
  echo "$bin_dir"
  exit 0
fi

echo "controlplane: downloading modules (k8s ${k8s_version}, etcd ${etcd_version}, kwok ${kwok_version})" >&2
if ! out=$(go mod download 2>&1); then
  echo "controlplane: go mod download failed:" >&2
  echo "$out" >&2
  exit 1
fi

# build_into DIR LDFLAGS PKG...: `go build` of PKG... into DIR, the output
# shown and the status returned on failure.
build_into() {
  local dir=$1 ldflags=$2 out
  shift 2
  if ! out=$(go build -trimpath -ldflags "$ldflags" -o "$dir" "$@" 2>&1); then
    echo "controlplane: building $* failed:" >&2
    echo "$out" >&2
    return 1
  fi
}

# Each binary is built to a temporary directory first, so an interrupted build
# never leaves a half-written binary that a later run would take as done.
tmp_dir=$(mktemp -d "$bin_dir/.build.XXXXXX")
trap 'rm -rf "$tmp_dir"' EXIT

k8s_missing=()
for name in "${k8s_binaries[@]}"; do
  [ -x "$bin_dir/$name" ] || k8s_missing+=("$name")
done
if [ ${#k8s_missing[@]} -gt 0 ]; then
  echo "controlplane: building ${k8s_missing[*]} from k8s.io/kubernetes@${k8s_version} ..." >&2
  start=$(date +%s)
  build_into "$tmp_dir/" "$k8s_ldflags" "${k8s_missing[@]/#/k8s.io/kubernetes/cmd/}" || exit 1
  for name in "${k8s_missing[@]}"; do mv "$tmp_dir/$name" "$bin_dir/$name"; done
  echo "controlplane: ${k8s_missing[*]} built in $(($(date +%s) - start)) s" >&2
fi

for t in "${others[@]}"; do
  IFS='|' read -r name pkg module ldflags <<<"$t"
  [ ! -x "$bin_dir/$name" ] || continue
  echo "controlplane: building $name from $module ..." >&2
  start=$(date +%s)
  build_into "$tmp_dir/$name" "$ldflags" "$pkg" || exit 1
  mv "$tmp_dir/$name" "$bin_dir/$name"
  echo "controlplane: $name built in $(($(date +%s) - start)) s" >&2
done

write_kwok_stages || exit 1
echo "controlplane: binaries in $bin_dir ($(du -sh "$bin_dir" | cut -f1))" >&2
echo "$bin_dir"
