#!/usr/bin/env bash
# `just e2e` where Docker and kind are: the suite of the real-node path
# (e2e/nodes/suite.sh) on a kind cluster. One suite, two ways to get a cluster.
#
# Creates (or reuses) the kind cluster nodewarden-e2e from kind-config.yaml (a
# control-plane node and two workers, the suite's real nodes), loads
# nodewarden's image from `just image` and the suite's other images
# (e2e/nodes/images.sh) with `kind load image-archive`, installs kwok in the
# cluster, then what e2e/nodes/install.sh installs on either cluster (the
# sim-cloud, Jaeger, nodewarden by `helm install` of charts/nodewarden), and
# runs e2e/nodes/suite.sh (all but the guard of this machine's nodes).
#
# Linux only: the images are written without Docker, as on the real-node path
# (the musl target, Go for the pinned Jaeger and helm, Debian's busybox-static).
#
# NODEWARDEN_E2E_KEEP=1     keep the cluster afterwards (default: delete it on exit)
# NODEWARDEN_E2E_IMAGE=...  an image archive to use instead of building one
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source-path=SCRIPTDIR source=../nodes/lib.sh
source "$repo/e2e/nodes/lib.sh"

KWOK_IMAGE=registry.k8s.io/kwok/kwok:v0.8.0
work=$repo/.run/e2e-kind
keep=${NODEWARDEN_E2E_KEEP:-0}
export E2E_WORK=$work E2E_ON=kind E2E_TIMINGS=$work/timings

# --- prerequisites ----------------------------------------------------------
need docker "install Docker (https://docs.docker.com/get-docker/)"
need kind "install kind (https://kind.sigs.k8s.io/docs/user/quick-start/#installation)"
need kubectl "install kubectl (https://kubernetes.io/docs/tasks/tools/)"
need curl "install curl"
need python3 "install python3 (the suite parses JSON with it)"
kind_minor=$(kind version | sed -n 's/^kind v0\.\([0-9][0-9]*\)\..*/\1/p')
if [ -n "$kind_minor" ] && [ "$kind_minor" -lt 22 ]; then
  die "kind $(kind version | awk '{print $2}') is too old: v0.22 or newer is needed (its default Kubernetes must be 1.29+)"
fi
docker info >/dev/null 2>&1 || die "Docker is installed but its daemon does not answer ('docker info' fails): start Docker, or check that your user may use it"

mkdir -p "$work"
rm -f "$work/timings" "$work/diagnostics.txt" "$work/traces.json"
export KUBECONFIG=$work/kubeconfig

cleanup() {
  local rc=$?
  if [ "$rc" != 0 ] && kubectl version --request-timeout=5s >/dev/null 2>&1; then
    dump_diagnostics "$work/diagnostics.txt"
  fi
  if [ "$keep" = 1 ]; then
    echo
    echo "The cluster $E2E_CLUSTER is kept (NODEWARDEN_E2E_KEEP=1):"
    echo "  export KUBECONFIG=$KUBECONFIG"
    echo "  kind delete cluster --name $E2E_CLUSTER   # when done"
  elif grep -qx "$E2E_CLUSTER" <<<"$(kind get clusters 2>/dev/null)"; then
    say "deleting the kind cluster $E2E_CLUSTER (NODEWARDEN_E2E_KEEP=1 keeps it)"
    kind delete cluster --name "$E2E_CLUSTER" >/dev/null 2>&1 || echo "warning: 'kind delete cluster --name $E2E_CLUSTER' failed" >&2
  fi
  [ "$rc" = 0 ] || echo "e2e FAILED (exit $rc); diagnostics: $work/diagnostics.txt" >&2
  return "$rc"
}
trap cleanup EXIT

# --- the images and helm ------------------------------------------------------
build() {
  say "building: nodewarden's image (just image), the suite's images, helm"
  image=${NODEWARDEN_E2E_IMAGE:-$("$repo/e2e/image/build.sh" amd64 | tail -n 1)}
  [ -s "$image" ] || die "no image archive at $image"
  export E2E_IMAGE=$image
  mapfile -t others < <("$repo/e2e/nodes/images.sh" --no-pause)
  helm=$("$repo/e2e/helm/build.sh" | tail -n 1)
}
phase "images and tools built" build

# --- the cluster --------------------------------------------------------------
create_cluster() {
  if grep -qx "$E2E_CLUSTER" <<<"$(kind get clusters 2>/dev/null)"; then
    say "reusing the kind cluster $E2E_CLUSTER"
  else
    say "creating the kind cluster $E2E_CLUSTER"
    kind create cluster --name "$E2E_CLUSTER" --config "$here/kind-config.yaml" \
      --kubeconfig "$KUBECONFIG" --wait 180s
  fi
  # Our own kubeconfig file: the user's ~/.kube/config and context are left alone.
  kind get kubeconfig --name "$E2E_CLUSTER" >"$KUBECONFIG"
  kubectl wait --for=condition=Ready nodes --all --timeout=180s >/dev/null
  # CEL validation rules in the CRDs and kwok's flowcontrol/v1 FlowSchema need 1.29+.
  local minor
  minor=$(kubectl version -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["minor"].rstrip("+"))')
  [ "$minor" -ge 29 ] || die "the cluster runs Kubernetes 1.$minor; the e2e suite needs 1.29 or newer (kind v0.22+)"
  # The workers are the suite's real nodes, as nw-node-1 and -2 are on this machine's.
  kubectl label nodes -l '!node-role.kubernetes.io/control-plane' nodewarden.dev/e2e-real=true --overwrite >/dev/null
  say "loading the images into the kind nodes"
  import_images "$image" "${others[@]}"
}
phase "kind cluster ready, images loaded" create_cluster

# --- kwok -------------------------------------------------------------------------
# kwok.yaml holds the Stage CRD and Stage objects together: apply the CRDs
# first, wait until they are served, then everything.
install_kwok() {
  say "installing kwok ($KWOK_IMAGE) with its default node and pod stages"
  awk '
    /^---$/ { if (crd) printf "---\n%s", doc; doc = ""; crd = 0; next }
    { doc = doc $0 "\n" }
    /^kind: CustomResourceDefinition$/ { crd = 1 }
    END { if (crd) printf "---\n%s", doc }
  ' "$here/kwok.yaml" >"$work/kwok-crds.yaml"
  kubectl apply --server-side --force-conflicts -f "$work/kwok-crds.yaml" >/dev/null
  kubectl wait --for=condition=Established -f "$work/kwok-crds.yaml" --timeout=60s >/dev/null
  kubectl apply --server-side --force-conflicts -f "$here/kwok.yaml" >/dev/null
  kubectl -n kube-system rollout status deploy/kwok-controller --timeout=180s
}
phase "kwok installed" install_kwok

# --- the sim-cloud, Jaeger and nodewarden (helm), as on the real nodes -------------
tools=$work/bin
mkdir -p "$tools"
ln -sf "$helm" "$tools/helm"
export PATH=$tools:$PATH HELM_CACHE_HOME=$work/helm/cache HELM_CONFIG_HOME=$work/helm/config HELM_DATA_HOME=$work/helm/data
phase "sim-cloud, Jaeger and nodewarden installed" "$repo/e2e/nodes/install.sh"

"$repo/e2e/nodes/suite.sh"
