#!/usr/bin/env bash
# Builds the pinned Helm v3 CLI (the `tool` of go.mod: helm.sh/helm/v3/cmd/helm)
# from Go modules into a cache directory outside the repository, keyed by
# go.mod, go.sum and this script. Prints the binary's path on its last line of
# stdout; does nothing when already built. The tests lint and render
# charts/nodewarden with it.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"

log_tag=helm
# shellcheck source-path=SCRIPTDIR source=../lib.sh
source "$here/../lib.sh"

module=helm.sh/helm/v3
pkg=$module/cmd/helm
version=$(awk -v m="$module" '$1==m {print $2}' go.mod)
[ -n "$version" ] || die "$module not found in go.mod"
bin_dir=$(go_tool_dir helm "$version" "$here/build.sh")
name=helm

if [ -x "$bin_dir/$name" ]; then
  log "$name $version present in $bin_dir"
  echo "$bin_dir/$name"
  exit 0
fi

require_go 26

# As Helm's Makefile sets them: the version `helm version` prints, and the
# Kubernetes version that `helm template` and `helm lint` assume without a
# cluster (one minor past the client-go it is built with).
client_go=$(awk '$1=="k8s.io/client-go" {print $2}' go.mod)
k8s_minor=$(echo "$client_go" | cut -d. -f2)
ldflags="-s -w -X $module/internal/version.version=$version"
for var in pkg/lint/rules pkg/chartutil; do
  ldflags+=" -X $module/$var.k8sVersionMajor=1 -X $module/$var.k8sVersionMinor=$k8s_minor"
done

go_build_tool "$bin_dir" "$name" "$pkg" "$ldflags" >&2
echo "$bin_dir/$name"
