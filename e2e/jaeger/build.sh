#!/usr/bin/env bash
# Builds the pinned Jaeger v2 all-in-one binary (`jaeger`, from
# github.com/jaegertracing/jaeger/cmd/jaeger) from Go modules into a cache
# directory outside the repository, keyed by the pinned versions. Prints the
# binary directory on its last line of stdout. Does nothing when already built.
#
# Jaeger v2 releases are published as Go module versions v1.N of
# github.com/jaegertracing/jaeger: v1.76.0 is Jaeger v2.13.0.
#
# The embedded web UI is not part of the Go module (it is a git submodule built
# with npm), so the binary serves Jaeger's placeholder page at /; the HTTP
# query API (/api/...) is complete.
#
# go.sum note: the module proxy reachable here does not answer checksum-database
# lookups for the OpenTelemetry collector modules this release needs, so go.sum
# was produced with
#   GOTOOLCHAIN=local GONOSUMDB=go.opentelemetry.io/collector,github.com/open-telemetry/opentelemetry-collector-contrib go mod tidy
# Building only needs go.sum (it is not consulted against sum.golang.org again).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"

# The key changes whenever a pinned version changes (go.mod / go.sum / this script).
key=$(cat go.mod go.sum build.sh | sha256sum | cut -c1-16)
module_version=$(awk '{ sub(/^require[ \t]+/, "") } $1=="github.com/jaegertracing/jaeger"{print $2}' go.mod)
[ -n "$module_version" ] || { echo "jaeger: github.com/jaegertracing/jaeger not found in go.mod" >&2; exit 1; }
jaeger_version=v2.13.0 # the Jaeger v2 release of module version v1.76.0
release_date=2025-12-03T16:07:08Z
cache_root=${NODEWARDEN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodewarden}
bin_dir="$cache_root/jaeger/${jaeger_version}-${module_version}-${key}"
mkdir -p "$bin_dir"

# Never download a Go toolchain: the pinned modules build with the local Go.
export GOTOOLCHAIN=local
export GOFLAGS="-mod=readonly -buildvcs=false"
export CGO_ENABLED=0
# Garbage collected less often, the compiler runs about a quarter faster
# (e2e/controlplane/build.sh has the figures).
export GOGC=${GOGC:-400}

go_minor=$(go env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/')
if [ "${go_minor:-0}" -lt 26 ]; then
  echo "jaeger: Go >= 1.26 is required (found $(go env GOVERSION))" >&2
  exit 1
fi

name=jaeger
pkg=github.com/jaegertracing/jaeger/cmd/jaeger
module="github.com/jaegertracing/jaeger@${module_version}"
ldflags="-s -w"
ldflags+=" -X github.com/jaegertracing/jaeger/internal/version.latestVersion=${jaeger_version}"
ldflags+=" -X github.com/jaegertracing/jaeger/internal/version.date=${release_date}"

# all-in-one.yaml: the in-memory all-in-one configuration shipped in the pinned
# module, copied next to the binary for reference (run.sh writes its own).
write_all_in_one() {
  local dir
  dir=$(go mod download -json "$module" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  [ -n "$dir" ] || { echo "jaeger: cannot locate module $module" >&2; return 1; }
  cp "$dir/cmd/jaeger/internal/all-in-one.yaml" "$bin_dir/.all-in-one.yaml.tmp"
  chmod 644 "$bin_dir/.all-in-one.yaml.tmp"
  mv "$bin_dir/.all-in-one.yaml.tmp" "$bin_dir/all-in-one.yaml"
}

if [ -x "$bin_dir/$name" ] && [ -s "$bin_dir/all-in-one.yaml" ]; then
  echo "jaeger: $name ${jaeger_version} present in $bin_dir" >&2
  echo "$bin_dir"
  exit 0
fi

echo "jaeger: downloading modules (jaeger ${jaeger_version} = ${module})" >&2
start=$(date +%s)
if ! out=$(go mod download 2>&1); then
  echo "jaeger: go mod download failed:" >&2
  echo "$out" >&2
  exit 1
fi
echo "jaeger: modules downloaded in $(($(date +%s) - start)) s" >&2

if [ -x "$bin_dir/$name" ]; then
  echo "jaeger: [1/1] $name already built" >&2
else
  echo "jaeger: [1/1] building $name from $module ..." >&2
  start=$(date +%s)
  # Build to a temporary name first so an interrupted build never leaves a
  # half-written binary that a later run would take as done.
  if ! out=$(go build -trimpath -ldflags "$ldflags" -o "$bin_dir/.$name.tmp" "$pkg" 2>&1); then
    echo "jaeger: building $name from module $module failed:" >&2
    echo "$out" >&2
    rm -f "$bin_dir/.$name.tmp"
    exit 1
  fi
  mv "$bin_dir/.$name.tmp" "$bin_dir/$name"
  echo "jaeger: [1/1] $name built in $(($(date +%s) - start)) s" >&2
fi

write_all_in_one || exit 1
echo "jaeger: binary in $bin_dir ($(du -sh "$bin_dir/$name" | cut -f1))" >&2
echo "$bin_dir"
