#!/usr/bin/env bash
# `just e2e` without Docker: nodewarden end to end on real nodes of this machine.
#
# Starts the local cluster with real kubelets (e2e/nodes/cluster.sh), imports
# nodewarden's image from `just image` and the other images (e2e/nodes/images.sh)
# into every node, deploys the sim-cloud and Jaeger as pods, installs nodewarden
# with `helm install` of charts/nodewarden (3 replicas, webhook through its
# Service, traces to Jaeger), then runs e2e/nodes/suite.sh.
#
# NODEWARDEN_E2E_KEEP=1     keep the cluster afterwards (default: stop it on exit)
# NODEWARDEN_E2E_IMAGE=...  an image archive to use instead of building one
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
export NODEWARDEN_RUN_DIR=${NODEWARDEN_RUN_DIR:-$repo/.run/e2e}
work=$NODEWARDEN_RUN_DIR
keep=${NODEWARDEN_E2E_KEEP:-0}
export E2E_WORK=$work/suite
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

cleanup() {
  local rc=$?
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

install() {
  say "deploying the sim-cloud and Jaeger as pods"
  kubectl create namespace "$E2E_NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  kubectl kustomize --load-restrictor=LoadRestrictionsNone "$here/sim-cloud" | kubectl apply -f - >/dev/null
  kubectl kustomize --load-restrictor=LoadRestrictionsNone "$here/jaeger" | kubectl apply -f - >/dev/null
  kubectl -n "$E2E_NS" rollout status deploy/sim-cloud --timeout=180s >/dev/null
  kubectl -n observability rollout status deploy/jaeger --timeout=180s >/dev/null
  say "helm install nodewarden charts/nodewarden (3 replicas, cloud sim, traces to Jaeger)"
  # upgrade --install: the same on a fresh cluster, and a rerun on a kept one.
  helm upgrade --install nodewarden "$repo/charts/nodewarden" --namespace "$E2E_NS" --create-namespace \
    -f "$here/values.yaml" --set etcd.hostPKI.path="$work/etcd-pki" --wait --timeout 300s >/dev/null
}
phase "sim-cloud, Jaeger and nodewarden installed" install

"$here/suite.sh"
