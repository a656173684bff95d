#!/usr/bin/env bash
# Builds azurefake, this directory's fake of Azure Resource Manager's scale-set
# calls and Azure's token endpoints (see README.md), into a cache directory
# outside the repository, keyed by go.mod, go.sum, this script and the fake's Go
# sources. Prints the binary directory on its last line of stdout; does nothing
# when already built. The binary is `azurefake`.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"
log_tag=azurefake
# shellcheck source-path=SCRIPTDIR source=../lib.sh
source "$here/../lib.sh"

require_go 26
# go_tool_dir keys on go.mod, go.sum and this script; the sources are the fake
# itself, so their hash stands where a pinned tool's version would.
sources=()
for f in ./*.go; do
  [[ "$f" == *_test.go ]] || sources+=("$f")
done
version=src-$(cat "${sources[@]}" | sha256sum | cut -c1-12)
bin_dir=$(go_tool_dir azurefake "$version" "$here/build.sh")
name=azurefake

if [ -x "$bin_dir/$name" ]; then
  log "$name $version present in $bin_dir"
  echo "$bin_dir"
  exit 0
fi

go_build_tool "$bin_dir" "$name" . >&2
echo "$bin_dir"
