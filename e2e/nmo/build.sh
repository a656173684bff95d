#!/usr/bin/env bash
# Builds the pinned Node Maintenance Operator's manager (the `tool` of go.mod:
# github.com/medik8s/node-maintenance-operator) from Go modules into a cache
# directory outside the repository, keyed by go.mod, go.sum and this script.
# Prints the binary directory on its last line of stdout; does nothing when
# already built. The binary is `nmo-manager`.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"

key=$(cat go.mod go.sum build.sh | sha256sum | cut -c1-16)
pkg=github.com/medik8s/node-maintenance-operator
version=$(awk -v m="$pkg" '$1==m {print $2}' go.mod)
[ -n "$version" ] || { echo "nmo: $pkg not found in go.mod" >&2; exit 1; }
cache_root=${NODEWARDEN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodewarden}
bin_dir="$cache_root/nmo/${version}-${key}"
name=nmo-manager
mkdir -p "$bin_dir"

if [ -x "$bin_dir/$name" ]; then
  echo "nmo: $name $version present in $bin_dir" >&2
  echo "$bin_dir"
  exit 0
fi

# Never download a Go toolchain; verify every module against go.sum (the
# checksum database does not answer for this one here, see go.mod).
export GOTOOLCHAIN=local
export GOFLAGS="-mod=readonly -buildvcs=false"
export GONOSUMDB=github.com/medik8s
export CGO_ENABLED=0

echo "nmo: building $name from $pkg@$version ..." >&2
start=$(date +%s)
# A temporary name first, so an interrupted build never looks done.
if ! out=$(go build -trimpath -ldflags "-s -w" -o "$bin_dir/.$name.tmp" "$pkg" 2>&1); then
  echo "nmo: building $pkg@$version failed:" >&2
  echo "$out" >&2
  rm -f "$bin_dir/.$name.tmp"
  exit 1
fi
mv "$bin_dir/.$name.tmp" "$bin_dir/$name"
echo "nmo: $name built in $(($(date +%s) - start)) s ($(du -sh "$bin_dir/$name" | cut -f1))" >&2
echo "$bin_dir"
