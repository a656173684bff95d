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

log_tag=jaeger
# shellcheck source-path=SCRIPTDIR source=../lib.sh
source "$here/../lib.sh"

module_version=$(awk '{ sub(/^require[ \t]+/, "") } $1=="github.com/jaegertracing/jaeger"{print $2}' go.mod)
[ -n "$module_version" ] || die "github.com/jaegertracing/jaeger not found in go.mod"
jaeger_version=v2.13.0 # the Jaeger v2 release of module version v1.76.0
release_date=2025-12-03T16:07:08Z
bin_dir=$(go_tool_dir jaeger "${jaeger_version}-${module_version}" "$here/build.sh")
require_go 26

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
  dir=$(module_dir "$module")
  cp "$dir/cmd/jaeger/internal/all-in-one.yaml" "$bin_dir/.all-in-one.yaml.tmp"
  chmod 644 "$bin_dir/.all-in-one.yaml.tmp"
  mv "$bin_dir/.all-in-one.yaml.tmp" "$bin_dir/all-in-one.yaml"
}

if [ -x "$bin_dir/$name" ] && [ -s "$bin_dir/all-in-one.yaml" ]; then
  log "$name ${jaeger_version} present in $bin_dir"
  echo "$bin_dir"
  exit 0
fi

if [ ! -x "$bin_dir/$name" ]; then
  log "downloading modules (jaeger ${jaeger_version} = ${module})"
  out=$(go_pinned go mod download 2>&1) || die "go mod download failed: $out"
  go_build_tool "$bin_dir" "$name" "$pkg" "$ldflags"
fi
write_all_in_one
log "binary in $bin_dir ($(du -sh "$bin_dir/$name" | cut -f1))"
echo "$bin_dir"
