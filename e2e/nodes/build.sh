#!/usr/bin/env bash
# Builds what the real nodes of the end-to-end cluster run, into a cache
# directory outside the repository keyed by the pinned versions: the kubelet
# and kube-proxy from the same k8s.io/kubernetes release as the control plane
# (go.mod here), and the pause binary from that release's build/pause/linux/pause.c.
# Prints the binary directory on its last line of stdout. Does nothing for
# binaries already built.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"

key=$(cat go.mod go.sum build.sh | sha256sum | cut -c1-16)
k8s_version=$(awk '$1=="k8s.io/kubernetes"{print $2; exit}' go.mod)
[ -n "$k8s_version" ] || k8s_version=$(sed -n 's/^require k8s.io\/kubernetes \(v[^ ]*\)$/\1/p' go.mod)
cache_root=${NODEWARDEN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodewarden}
bin_dir="$cache_root/nodes/${k8s_version}-${key}"
mkdir -p "$bin_dir"

export GOTOOLCHAIN=local
export GOFLAGS="-mod=readonly -buildvcs=false"
export CGO_ENABLED=0

k8s_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=${k8s_version}"
k8s_ldflags+=" -X k8s.io/component-base/version.gitMajor=1"
k8s_ldflags+=" -X k8s.io/component-base/version.gitMinor=$(echo "$k8s_version" | cut -d. -f2)"
k8s_ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"

built=0
for name in kubelet kube-proxy; do
  [ -x "$bin_dir/$name" ] && continue
  [ "$built" -eq 1 ] || go mod download k8s.io/kubernetes >&2
  built=1
  echo "nodes: building $name from k8s.io/kubernetes@${k8s_version} ..." >&2
  start=$(date +%s)
  # A temporary name first: an interrupted build never leaves a binary a
  # later run would take as done.
  if ! out=$(go build -trimpath -ldflags "$k8s_ldflags" -o "$bin_dir/.$name.tmp" "k8s.io/kubernetes/cmd/$name" 2>&1); then
    echo "nodes: building $name failed:" >&2
    echo "$out" >&2
    rm -f "$bin_dir/.$name.tmp"
    exit 1
  fi
  mv "$bin_dir/.$name.tmp" "$bin_dir/$name"
  echo "nodes: $name built in $(($(date +%s) - start)) s" >&2
done

if [ ! -x "$bin_dir/pause" ]; then
  dir=$(go mod download -json "k8s.io/kubernetes@${k8s_version}" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  [ -n "$dir" ] || { echo "nodes: cannot locate module k8s.io/kubernetes@${k8s_version}" >&2; exit 1; }
  gcc -Os -static -o "$bin_dir/.pause.tmp" "$dir/build/pause/linux/pause.c"
  mv "$bin_dir/.pause.tmp" "$bin_dir/pause"
fi

echo "$bin_dir"
