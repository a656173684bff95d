#!/usr/bin/env bash
# Builds the pinned Node Maintenance Operator's manager (the `tool` of go.mod:
# github.com/medik8s/node-maintenance-operator) from Go modules into a cache
# directory outside the repository, keyed by go.mod, go.sum and this script.
# Prints the binary directory on its last line of stdout; does nothing when
# already built. The binary is `nmo-manager`.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"
log_tag=nmo
# shellcheck source-path=SCRIPTDIR source=../lib.sh
source "$here/../lib.sh"

pkg=github.com/medik8s/node-maintenance-operator
version=$(awk -v m="$pkg" '$1==m {print $2}' go.mod)
[ -n "$version" ] || die "$pkg not found in go.mod"
bin_dir=$(go_tool_dir nmo "$version" "$here/build.sh")
name=nmo-manager

if [ -x "$bin_dir/$name" ]; then
  log "$name $version present in $bin_dir"
  echo "$bin_dir"
  exit 0
fi

# The checksum database does not answer for this module here (see go.mod);
# go.sum still verifies it.
export GONOSUMDB=github.com/medik8s
go_build_tool "$bin_dir" "$name" "$pkg" "-s -w" >&2
echo "$bin_dir"
