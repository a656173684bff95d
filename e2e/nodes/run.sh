#!/usr/bin/env bash
# `just e2e` without Docker: nodewarden end to end on real nodes of this machine.
#
# Starts the local cluster with real kubelets (e2e/nodes/cluster.sh), imports
# nodewarden's image from `just image` and the other images (e2e/nodes/images.sh)
# into every node, deploys the sim-cloud and Jaeger as pods, installs nodewarden
# with `helm install` of charts/nodewarden (3 replicas, webhook through its
# Service, traces to Jaeger; e2e/nodes/install.sh), then runs e2e/nodes/suite.sh.
#
# NODEWARDEN_E2E_KEEP=1     keep the cluster afterwards (default: stop it on exit)
# NODEWARDEN_E2E_IMAGE=...  an image archive to use instead of building one
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
export NODEWARDEN_RUN_DIR=${NODEWARDEN_RUN_DIR:-$repo/.run/e2e}
work=$NODEWARDEN_RUN_DIR
keep=${NODEWARDEN_E2E_KEEP:-0}
export E2E_WORK=$work/suite E2E_ON=nodes
E2E_START=$(date +%s)
export E2E_START
mkdir -p "$E2E_WORK"
export E2E_TIMINGS=$E2E_WORK/timings
rm -f "$E2E_TIMINGS"
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$here/lib.sh"

[ "$(id -u)" = 0 ] || die "real nodes need root (bridges, iptables, containerd); kind needs Docker"

build() {
  say "building: nodewarden's image (just image), the nodes' images, helm"
  if [ -n "${NODEWARDEN_E2E_IMAGE:-}" ]; then
    image=$NODEWARDEN_E2E_IMAGE
  else
    image=$("$repo/e2e/image/build.sh" amd64 | tail -n 1)
  fi
  [ -s "$image" ] || die "no image archive at $image"
  export E2E_IMAGE=$image
  mapfile -t others < <("$here/images.sh")
  helm=$("$repo/e2e/helm/build.sh" | tail -n 1)
}
phase "images and tools built" build

# keep_node_logs: the nodes' own logs, which `cluster.sh down` removes, copied to
# E2E_WORK/node-logs and their last lines shown (CI keeps only the output).
keep_node_logs() {
  local f
  mkdir -p "$E2E_WORK/node-logs"
  for f in "$work"/nodes/*/*.log; do
    [ -f "$f" ] || continue
    cp "$f" "$E2E_WORK/node-logs/$(basename "$(dirname "$f")")-$(basename "$f")"
    echo "=== last lines of $f" >&2
    tail -n 15 "$f" >&2
  done
}

cleanup() {
  local rc=$?
  [ "$rc" = 0 ] || keep_node_logs
  if [ "$keep" = 1 ]; then
    echo "The cluster is kept (NODEWARDEN_E2E_KEEP=1): export KUBECONFIG=$work/kubeconfig;"
    echo "  stop it with: e2e/nodes/cluster.sh down"
  else
    "$here/cluster.sh" down >/dev/null 2>&1 || echo "warning: e2e/nodes/cluster.sh down failed" >&2
  fi
  [ "$rc" = 0 ] || echo "e2e FAILED (exit $rc); logs in $work, diagnostics in $E2E_WORK/diagnostics.txt" >&2
  return "$rc"
}
trap cleanup EXIT

cluster() {
  say "starting the cluster: control plane, kwok and ${NODEWARDEN_REAL_NODES:-2} real nodes"
  export KUBECONFIG
  KUBECONFIG=$("$here/cluster.sh" up | tail -n 1)
  "$here/cluster.sh" import "$image" "${others[@]}"
}
phase "cluster up, images imported" cluster

# The suites call kubectl and helm by name: the pinned builds.
tools=$work/bin
mkdir -p "$tools"
ln -sf "$(cat "$work/bin-dir")/kubectl" "$tools/kubectl"
ln -sf "$helm" "$tools/helm"
export PATH=$tools:$PATH HELM_CACHE_HOME=$work/helm/cache HELM_CONFIG_HOME=$work/helm/config HELM_DATA_HOME=$work/helm/data

phase "sim-cloud, Jaeger and nodewarden installed" "$here/install.sh" --set etcd.hostPKI.path="$work/etcd-pki"

"$here/suite.sh"
