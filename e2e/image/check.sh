#!/usr/bin/env bash
# Checks the image archive `build.sh ARCH` wrote (see check.py for what is
# checked), with go-containerregistry's validators built pinned (validate/)
# into the cache outside the repository.
#
#   check.sh [amd64|arm64]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
log_tag=image
# shellcheck source-path=SCRIPTDIR source=../lib.sh
source "$here/../lib.sh"
# shellcheck source-path=SCRIPTDIR source=name.sh
source "$here/name.sh"

arch=${1:-amd64}
archive=$(image_archive "$arch")
[ -s "$archive" ] || die "no $archive: run \`just image $arch\` first"

cd "$here/validate"
module=github.com/google/go-containerregistry
bin_dir=$(go_tool_dir image-validate "$(awk -v m="$module" '$1==m {print $2}' go.mod)" main.go)
[ -x "$bin_dir/validate" ] || go_build_tool "$bin_dir" validate . >&2

python3 "$here/check.py" "$archive" "$arch" "$bin_dir/validate" "$image_ref"
