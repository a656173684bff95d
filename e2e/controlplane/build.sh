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

log_tag=controlplane
# shellcheck source-path=SCRIPTDIR source=../lib.sh
source "$here/../lib.sh"

# The key changes whenever a pinned version changes (go.mod / go.sum / this script).
key=$(cat go.mod go.sum build.sh | sha256sum | cut -c1-16)
k8s_version=$(awk '$1=="k8s.io/kubernetes"{print $2}' go.mod)
etcd_version=$(awk '$1=="go.etcd.io/etcd/server/v3"{print $2}' go.mod)
kwok_version=$(awk '$1=="sigs.k8s.io/kwok"{print $2}' go.mod)
cache_root=${NODEWARDEN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodewarden}
bin_dir="$cache_root/controlplane/${k8s_version}-etcd${etcd_version}-kwok${kwok_version}-${key}"
mkdir -p "$bin_dir"
require_go 26

k8s_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=${k8s_version}"
k8s_ldflags+=" -X k8s.io/component-base/version.gitMajor=1"
k8s_ldflags+=" -X k8s.io/component-base/version.gitMinor=$(echo "$k8s_version" | cut -d. -f2)"
k8s_ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"

# The Kubernetes binaries come from one `go build`: the packages they share
# (most of them) are compiled once, and the links run side by side.
k8s_binaries=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
[ "$with_nodes" -eq 0 ] || k8s_binaries+=(kubelet kube-proxy)

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
  dir=$(module_dir "sigs.k8s.io/kwok@${kwok_version}")
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
    log "wrote $bin_dir/kwok-stages.yaml"
  fi
}

missing=()
for name in "${k8s_binaries[@]}" etcd kwok; do
  [ -x "$bin_dir/$name" ] || missing+=("$name")
done
if [ ${#missing[@]} -eq 0 ]; then
  write_kwok_stages
  log "all binaries present in $bin_dir"
  echo "$bin_dir"
  exit 0
fi

log "downloading modules (k8s ${k8s_version}, etcd ${etcd_version}, kwok ${kwok_version})"
out=$(go_pinned go mod download 2>&1) || die "go mod download failed: $out"

k8s_missing=()
for name in "${k8s_binaries[@]}"; do
  [ -x "$bin_dir/$name" ] || k8s_missing+=("k8s.io/kubernetes/cmd/$name")
done
if [ ${#k8s_missing[@]} -gt 0 ]; then
  go_build_binaries "$bin_dir" "$k8s_ldflags" "${k8s_missing[@]}"
fi
# etcd and kwok come from other modules, in the same module graph.
if [ ! -x "$bin_dir/etcd" ]; then
  go_build_tool "$bin_dir" etcd go.etcd.io/etcd/server/v3
fi
if [ ! -x "$bin_dir/kwok" ]; then
  go_build_tool "$bin_dir" kwok sigs.k8s.io/kwok/cmd/kwok "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${kwok_version}"
fi

write_kwok_stages
log "binaries in $bin_dir ($(du -sh "$bin_dir" | cut -f1))"
echo "$bin_dir"
