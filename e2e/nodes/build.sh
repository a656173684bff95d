#!/usr/bin/env bash
# Builds what the real nodes of the end-to-end cluster run, into the control
# plane's cache directory (outside the repository, keyed by the pinned
# versions): the kubelet and kube-proxy from the control plane's own module
# (e2e/controlplane/go.mod, so the packages they share with the control plane
# are built once), and the pause binary from that release's
# build/pause/linux/pause.c. Prints the binary directory on its last line of
# stdout. Does nothing for binaries already built.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
controlplane="$here/../controlplane"
log_tag=nodes
# shellcheck source-path=SCRIPTDIR source=../lib.sh
source "$here/../lib.sh"
bin_dir=$("$controlplane/build.sh" --nodes | tail -n 1)

if [ ! -x "$bin_dir/pause" ]; then
  k8s_version=$(awk '$1=="k8s.io/kubernetes"{print $2; exit}' "$controlplane/go.mod")
  dir=$(cd "$controlplane" && module_dir "k8s.io/kubernetes@${k8s_version}")
  gcc -Os -static -o "$bin_dir/.pause.tmp" "$dir/build/pause/linux/pause.c"
  mv "$bin_dir/.pause.tmp" "$bin_dir/pause"
fi

echo "$bin_dir"
