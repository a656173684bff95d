#!/usr/bin/env bash
# Prints the absolute path of metal3's genuine BareMetalHost CRD
# (baremetalhosts.metal3.io, metal3.io/v1alpha1) as shipped in the Go module
# github.com/metal3-io/baremetal-operator at the version go.mod pins. The module
# is downloaded into the Go module cache on first use, verified against the
# committed go.sum; later runs only look it up there (and check it again).
#   kubectl apply --server-side -f "$(e2e/metal3/crd.sh)"
# The module's other CRDs (HostFirmwareSettings, HardwareData, ...) sit beside
# it in the same directory; only this one is printed.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"

module=github.com/metal3-io/baremetal-operator
crd=config/base/crds/bases/metal3.io_baremetalhosts.yaml

version=$(awk '{ sub(/^require[ \t]+/, "") } $1=="'"$module"'"{print $2}' go.mod)
[ -n "$version" ] || { echo "metal3: $module not found in go.mod" >&2; exit 1; }
# The download must be checked against a line committed in go.sum: without
# one, go would fetch the checksum database's answer and write it there.
grep -q "^$module $version h1:" go.sum || {
  echo "metal3: go.sum has no checksum for $module $version" >&2
  exit 1
}

# Never download a Go toolchain; never let go touch go.mod (GOFLAGS=-mod=mod
# would) or pick up a go.work from above.
export GOTOOLCHAIN=local
export GOFLAGS=-mod=readonly
export GOWORK=off

go_minor=$(go env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/')
if [ "${go_minor:-0}" -lt 25 ]; then
  echo "metal3: Go >= 1.25 is required (found $(go env GOVERSION))" >&2
  exit 1
fi

# Quick on a warm cache (no network); on a cold one it fetches the module's
# zip (under 1 MB) from GOPROXY.
if ! out=$(go mod download -json "$module" 2>&1); then
  echo "metal3: go mod download $module@$version failed:" >&2
  echo "$out" >&2
  exit 1
fi
dir=$(sed -n 's/^\t"Dir": "\(.*\)",$/\1/p' <<<"$out")
[ -n "$dir" ] || { echo "metal3: cannot locate module $module@$version in: $out" >&2; exit 1; }
[ -s "$dir/$crd" ] || { echo "metal3: $module@$version has no $crd" >&2; exit 1; }
echo "$dir/$crd"
