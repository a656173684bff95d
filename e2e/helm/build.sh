#!/usr/bin/env bash
# Builds the pinned Helm v3 CLI (the `tool` of go.mod: helm.sh/helm/v3/cmd/helm)
# from Go modules into a cache directory outside the repository, keyed by
# go.mod, go.sum and this script. Prints the binary's path on its last line of
# stdout; does nothing when already built. The tests lint and render
# charts/nodewarden with it.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"

key=$(cat go.mod go.sum build.sh | sha256sum | cut -c1-16)
module=helm.sh/helm/v3
pkg=$module/cmd/helm
version=$(awk -v m="$module" '$1==m {print $2}' go.mod)
[ -n "$version" ] || { echo "helm: $module not found in go.mod" >&2; exit 1; }
cache_root=${NODEWARDEN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodewarden}
bin_dir="$cache_root/helm/${version}-${key}"
name=helm
mkdir -p "$bin_dir"

if [ -x "$bin_dir/$name" ]; then
  echo "helm: $name $version present in $bin_dir" >&2
  echo "$bin_dir/$name"
  exit 0
fi

# Never download a Go toolchain; verify every module against go.sum.
export GOTOOLCHAIN=local
export GOFLAGS="-mod=readonly -buildvcs=false"
export CGO_ENABLED=0

go_minor=$(go env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/')
if [ "${go_minor:-0}" -lt 26 ]; then
  echo "helm: Go >= 1.26 is required (found $(go env GOVERSION))" >&2
  exit 1
fi

# As Helm's Makefile sets them: the version `helm version` prints, and the
# Kubernetes version that `helm template` and `helm lint` assume without a
# cluster (one minor past the client-go it is built with).
client_go=$(awk '$1=="k8s.io/client-go" {print $2}' go.mod)
k8s_minor=$(echo "$client_go" | cut -d. -f2)
ldflags="-s -w -X $module/internal/version.version=$version"
for var in pkg/lint/rules pkg/chartutil; do
  ldflags+=" -X $module/$var.k8sVersionMajor=1 -X $module/$var.k8sVersionMinor=$k8s_minor"
done

echo "helm: building $name from $module@$version ..." >&2
start=$(date +%s)
# A temporary name first, so an interrupted build never looks done.
if ! out=$(go build -trimpath -ldflags "$ldflags" -o "$bin_dir/.$name.tmp" "$pkg" 2>&1); then
  echo "helm: building $module@$version failed:" >&2
  echo "$out" >&2
  rm -f "$bin_dir/.$name.tmp"
  exit 1
fi
mv "$bin_dir/.$name.tmp" "$bin_dir/$name"
echo "helm: $name built in $(($(date +%s) - start)) s ($(du -sh "$bin_dir/$name" | cut -f1))" >&2
echo "$bin_dir/$name"
