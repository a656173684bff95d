#!/usr/bin/env bash
# `just e2e`: nodewarden end to end on a kind cluster.
#
# Creates (or reuses) the kind cluster nodewarden-e2e, builds the nodewarden
# image and loads it into kind, installs kwok, nodewarden's namespaces, CRDs
# and RBAC, the sim-cloud, Jaeger and nodewarden itself (3 replicas), waits
# until they run and one replica leads, then runs e2e/kind/suite.sh.
#
# NODEWARDEN_E2E_KEEP=1        keep the cluster afterwards (default: delete it on exit)
# NODEWARDEN_E2E_SKIP_BUILD=1  reuse the image nodewarden:e2e already in Docker
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$here/lib.sh"

IMAGE=nodewarden:e2e
KWOK_IMAGE=registry.k8s.io/kwok/kwok:v0.8.0
work=$repo/.run/e2e-kind
keep=${NODEWARDEN_E2E_KEEP:-0}
export E2E_WORK=$work
export E2E_TIMINGS=$work/timings

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
[ -s "$repo/observability/jaeger.yaml" ] || die "observability/jaeger.yaml is missing: the suite deploys Jaeger from it"

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
    echo "  kubectl -n observability port-forward svc/jaeger-collector 16686   # Jaeger UI: http://localhost:16686"
    echo "  kind delete cluster --name $E2E_CLUSTER                             # when done"
  elif kind get clusters 2>/dev/null | grep -qx "$E2E_CLUSTER"; then
    say "deleting the kind cluster $E2E_CLUSTER (NODEWARDEN_E2E_KEEP=1 keeps it)"
    kind delete cluster --name "$E2E_CLUSTER" >/dev/null 2>&1 || echo "warning: 'kind delete cluster --name $E2E_CLUSTER' failed" >&2
  fi
  [ "$rc" = 0 ] || echo "e2e FAILED (exit $rc); diagnostics: $work/diagnostics.txt" >&2
  return "$rc"
}
trap cleanup EXIT

# --- the cluster --------------------------------------------------------------
reused=0
create_cluster() {
  if kind get clusters 2>/dev/null | grep -qx "$E2E_CLUSTER"; then
    say "reusing the kind cluster $E2E_CLUSTER"
    reused=1
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
}
phase "kind cluster ready" create_cluster

# --- the image ------------------------------------------------------------------
build_image() {
  if [ "${NODEWARDEN_E2E_SKIP_BUILD:-0}" = 1 ] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
    say "using the existing image $IMAGE (NODEWARDEN_E2E_SKIP_BUILD=1)"
    return
  fi
  say "building $IMAGE (docker build; the first build compiles nodewarden in release mode)"
  docker build -t "$IMAGE" "$repo"
}
phase "docker build" build_image
load_image() {
  say "loading $IMAGE into kind"
  kind load docker-image "$IMAGE" --name "$E2E_CLUSTER"
}
phase "kind load docker-image" load_image

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

# --- nodewarden's namespaces, CRDs and RBAC, the sim-cloud, Jaeger ------------------
has_jaeger_pods() { [ -n "$(kubectl -n observability get pods -o name)" ]; }
install_base() {
  say "applying manifests/base/namespace.yaml, crds.yaml, rbac.yaml"
  kubectl apply -f "$repo/manifests/base/namespace.yaml" >/dev/null
  kubectl apply --server-side --force-conflicts -f "$repo/manifests/base/crds.yaml" >/dev/null
  kubectl wait --for=condition=Established -f "$repo/manifests/base/crds.yaml" --timeout=60s >/dev/null
  kubectl apply -f "$repo/manifests/base/rbac.yaml" >/dev/null

  say "deploying the sim-cloud (manifests/sim-cloud patched by e2e/kind/sim-cloud)"
  kubectl kustomize --load-restrictor=LoadRestrictionsNone "$here/sim-cloud" | kubectl apply -f - >/dev/null
  # On a reused cluster the image may be new: restart what runs it.
  [ "$reused" = 0 ] || kubectl -n "$E2E_NS" rollout restart deploy/sim-cloud >/dev/null
  kubectl -n "$E2E_NS" rollout status deploy/sim-cloud --timeout=180s

  say "deploying Jaeger (observability/jaeger.yaml)"
  kubectl create namespace observability --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  kubectl kustomize --load-restrictor=LoadRestrictionsNone "$here/jaeger" | kubectl apply -f - >/dev/null
  retry_until 60 "Jaeger's pods to be created" has_jaeger_pods
  if [ -n "$(kubectl -n observability get deploy -o name)" ]; then
    kubectl -n observability wait --for=condition=Available deploy --all --timeout=300s
  else
    kubectl -n observability wait --for=condition=Ready pod --all --timeout=300s
  fi
}
phase "namespaces, CRDs, RBAC, sim-cloud and Jaeger" install_base

# --- nodewarden -------------------------------------------------------------------
deploy_nodewarden() {
  say "deploying nodewarden (the manifests/sim overlay patched by e2e/kind/kustomization.yaml)"
  kubectl kustomize --load-restrictor=LoadRestrictionsNone "$here" |
    kubectl apply --server-side --force-conflicts -f - >/dev/null
  [ "$reused" = 0 ] || kubectl -n "$E2E_NS" rollout restart deploy/nodewarden >/dev/null
  kubectl -n "$E2E_NS" rollout status deploy/nodewarden --timeout=300s
  local ready
  ready=$(kubectl -n "$E2E_NS" get deploy nodewarden -o jsonpath='{.status.readyReplicas}')
  [ "$ready" = 3 ] || die "nodewarden has ${ready:-0} Ready replicas, not 3"
  say "waiting for one replica to hold the Lease nodewarden"
  local deadline holder pods
  deadline=$(($(date +%s) + 90))
  while :; do
    holder=$(lease_holder "$E2E_NS" nodewarden)
    pods=" $(kubectl -n "$E2E_NS" get pods -l app.kubernetes.io/name=nodewarden \
      --field-selector=status.phase=Running -o jsonpath='{.items[*].metadata.name}') "
    if [ -n "$holder" ] && [[ "$pods" == *" $holder "* ]]; then
      break
    fi
    [ "$(date +%s)" -lt "$deadline" ] || die "no running nodewarden pod holds the Lease (holder: '${holder:-none}', pods:$pods)"
    sleep 2
  done
  say "nodewarden: 3 Ready replicas, leader $holder"
}
phase "nodewarden 3 replicas Ready, leader elected" deploy_nodewarden

# --- the suite ----------------------------------------------------------------------
"$here/suite.sh"
